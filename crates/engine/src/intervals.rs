//! Byte intervals `[start, end)` as the stripe cache, verify reads and guided resync keep them.

/// Merge intervals into sorted, disjoint ones (touching ones join).
pub(crate) fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// [`merge`], empty intervals left out.
pub(crate) fn merge_nonempty(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|(a, b)| a < b);
    merge(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_merge_into_sorted_disjoint_ones() {
        assert_eq!(
            merge(vec![(5, 9), (0, 2), (2, 4), (8, 12)]),
            vec![(0, 4), (5, 12)]
        );
        assert_eq!(
            merge_nonempty(vec![(5, 9), (0, 2), (8, 12), (2, 3), (20, 20)]),
            vec![(0, 3), (5, 12)]
        );
        assert!(merge_nonempty(vec![]).is_empty());
        // An empty interval inside another is absorbed by merge, dropped by merge_nonempty.
        assert_eq!(merge(vec![(20, 20)]), vec![(20, 20)]);
    }
}
