//! Sizes on the command line: plain bytes or K, M, G, T suffixes (powers of 1024).

/// Parse "512K", "1M", "4096", "2g" into bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(format!(
                        "'{s}': unknown size suffix '{c}' (use K, M, G or T)"
                    ))
                }
            };
            (&s[..i], shift)
        }
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (plain bytes or a number with K, M, G, T)"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// mdadm's warning when members differ in size by more than 1 %: every member contributes
/// only as much as the smallest, so the rest of a larger one lies unused. `sizes`: (path,
/// bytes) of each member. Returns the warning, if any.
pub fn uneven_members(sizes: &[(String, u64)]) -> Option<String> {
    let (small_path, small) = sizes.iter().min_by_key(|(_, b)| *b)?;
    let (large_path, large) = sizes.iter().max_by_key(|(_, b)| *b)?;
    // More than 1 %: large > small * 1.01, in integers.
    if (*large as u128) * 100 <= (*small as u128) * 101 {
        return None;
    }
    Some(format!(
        "largest member {large_path} ({}) exceeds the smallest, {small_path} ({}), by more \
         than 1%: every member contributes only {} (what the smallest has), the rest of the \
         larger ones is unused",
        human(*large),
        human(*small),
        human(*small)
    ))
}

/// "512K", "1.5M"-style rendering for humans.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_differing_by_more_than_one_percent_are_named() {
        let m = |n: &str, b: u64| (n.to_string(), b);
        assert_eq!(uneven_members(&[]), None);
        assert_eq!(
            uneven_members(&[m("a", 100 << 20), m("b", 101 << 20)]),
            None
        );
        let w = uneven_members(&[m("a", 64 << 20), m("b", 3 << 20), m("c", 64 << 20)]).unwrap();
        assert!(w.contains("(64.00 MiB)") && w.contains("b (3"), "{w}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("3G"), Ok(3 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(1536), "1.50 KiB");
    }
}
