//! The parity of a stripe's data chunks, wherever it is computed (the write path, journal
//! recovery): P alone for RAID4/5, P and Q for RAID6 with the data put in md's syndrome order.

use layout::StripeRoles;

/// Fill `p` (and `q`, which RAID6 needs and RAID4/5 must not get) from `data`, given in
/// data-index order.
pub(crate) fn fill(roles: &StripeRoles, data: &[&[u8]], p: &mut [u8], q: Option<&mut [u8]>) {
    let Some(q) = q else {
        assert!(roles.q_dev().is_none(), "RAID6 parity needs Q");
        parity::xor_gen(data, p);
        return;
    };
    assert!(roles.q_dev().is_some(), "only RAID6 has Q");
    let mut by_syndrome: Vec<&[u8]> = vec![&[]; data.len()];
    for (d, &buf) in data.iter().enumerate() {
        by_syndrome[roles.syndrome(d)] = buf;
    }
    parity::pq_gen(&by_syndrome, p, q);
}
