//! Independent reference model of md's layouts, written straight from the
//! prose and worked examples of md-format.md §2–§4 by *filling grids*
//! (device × row), deliberately in a different style from the crate:
//! parity rows are built cell by cell, RAID10 by walking row-major cells,
//! RAID0 by filling zones row by row. The layout crate's tests compare the crate with it; the
//! [`oracle`](crate::oracle) checks member images with it. It lives here, in a crate that does not
//! depend on `layout`, so it cannot borrow from the code it checks.

/// One cell of a parity stripe row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    /// Array chunk number.
    D(u64),
    P,
    Q,
    Empty,
}

fn p_column(layout_low: u32, width: usize, stripe: u64) -> usize {
    let s = (stripe % width as u64) as usize;
    match layout_low {
        0 | 2 => width - 1 - s, // "left": starts last, moves left
        1 | 3 => s,             // "right": starts first, moves right
        4 => 0,
        5 => width - 1,
        _ => unreachable!(),
    }
}

/// Build one parity row. Returns the cells and, for RAID6, the syndrome
/// syndrome of each column (None for P/Q).
pub fn parity_row(level: u32, layout: u32, n: usize, stripe: u64) -> Vec<Cell> {
    let k = n - if level == 6 { 2 } else { 1 };
    let mut row = vec![Cell::Empty; n];
    let mut first_chunk = stripe * k as u64;
    let (low, width, q_last) = match (level, layout) {
        (4, _) => (5, n, false),
        (5, l) => (l, n, false),
        (6, l) if l >= 16 => (l - 16, n - 1, true),
        (6, l) => (l, n, false),
        _ => unreachable!(),
    };
    let p = if level == 6 && !q_last && low == 5 {
        n - 2 // RAID6 parity-last: P then Q on the last two devices
    } else {
        p_column(low, width, stripe)
    };
    row[p] = Cell::P;
    let mut after = p; // fill starts after this column for symmetric layouts
    if level == 6 {
        let q = if q_last { n - 1 } else { (p + 1) % n };
        row[q] = Cell::Q;
        if !q_last {
            after = q;
        }
    }
    let symmetric = low == 2 || low == 3;
    let order: Vec<usize> = if symmetric {
        (1..=width).map(|i| (after + i) % width).collect()
    } else {
        (0..n).collect()
    };
    for col in order {
        if row[col] == Cell::Empty {
            row[col] = Cell::D(first_chunk);
            first_chunk += 1;
        }
    }
    assert!(!row.contains(&Cell::Empty));
    row
}

/// RAID6 syndrome index per column: walk from the column after Q, cyclically,
/// numbering data columns.
pub fn syndromes(row: &[Cell]) -> Vec<Option<usize>> {
    let n = row.len();
    let q = row.iter().position(|c| *c == Cell::Q).unwrap();
    let mut out = vec![None; n];
    let mut next = 0;
    for i in 1..=n {
        let col = (q + i) % n;
        if let Cell::D(_) = row[col] {
            out[col] = Some(next);
            next += 1;
        }
    }
    out
}

/// Render a parity row like the tables in md-format.md ("D0 D1 P Q D2").
pub fn render(row: &[Cell]) -> String {
    row.iter()
        .map(|c| match c {
            Cell::D(x) => format!("D{x}"),
            Cell::P => "P".into(),
            Cell::Q => "Q".into(),
            Cell::Empty => "-".into(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// RAID10 model: for each array chunk, its copies as (dev, device chunk row),
/// in md copy order (near copy j, then its far copies).
pub struct Raid10Model {
    pub array_chunks: u64,
    pub copies: Vec<Vec<(usize, u64)>>,
}

pub fn raid10_model(n: usize, nc: usize, fc: usize, offset: bool, size_chunks: u64) -> Raid10Model {
    let array_chunks = (size_chunks / fc as u64) * n as u64 / nc as u64;
    let per_dev = (array_chunks * (nc * fc) as u64).div_ceil(n as u64);
    let far_rows = if offset { 1 } else { per_dev / fc as u64 };
    let mut copies = Vec::new();
    // Walk the near section row-major: cell i holds chunk i / nc.
    for c in 0..array_chunks {
        let mut list = Vec::new();
        for j in 0..nc {
            let cell = c * nc as u64 + j as u64;
            let dev = (cell % n as u64) as usize;
            let grid_row = cell / n as u64;
            let row = if offset {
                grid_row * fc as u64
            } else {
                grid_row
            };
            for f in 0..fc {
                list.push(((dev + f * nc) % n, row + f as u64 * far_rows));
            }
        }
        copies.push(list);
    }
    Raid10Model {
        array_chunks,
        copies,
    }
}

/// RAID0 model: fill zone by zone, row by row. Returns (dev, device chunk)
/// of every array chunk.
pub fn raid0_model(sizes_chunks: &[u64], original: bool) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let mut done = 0u64; // device chunks consumed by earlier zones
    loop {
        let members: Vec<usize> = (0..sizes_chunks.len())
            .filter(|&d| sizes_chunks[d] > done)
            .collect();
        if members.is_empty() {
            return out;
        }
        let top = members.iter().map(|&d| sizes_chunks[d]).min().unwrap();
        let z = members.len() as u64;
        for row in done..top {
            for j in 0..z {
                let chunk = out.len() as u64;
                let idx = if original { chunk % z } else { j };
                out.push((members[idx as usize], row));
            }
        }
        done = top;
    }
}

/// Linear model: (dev, device sector) of every array sector, as a list of
/// (dev, start, len) extents.
pub fn linear_model(sizes: &[u64], rounding: u64) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    for (d, &s) in sizes.iter().enumerate() {
        let s = if rounding > 0 { s - s % rounding } else { s };
        for x in 0..s {
            out.push((d, x));
        }
    }
    out
}
