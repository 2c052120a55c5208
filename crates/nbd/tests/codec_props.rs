//! Property tests: the pure codec never panics on arbitrary bytes, and
//! encoders round-trip through the parsers.

use nbd::codec::{self, ClientOption, Request};
use nbd::command::{self, ExportParams};
use nbd::proto::*;
use proptest::prelude::*;

fn params() -> impl Strategy<Value = ExportParams> {
    (
        any::<u64>(),
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        proptest::option::of(0u32..70000),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(
            |(size, flags, structured, base_allocation, align, max_payload, fast_zero)| {
                ExportParams {
                    size,
                    flags,
                    structured,
                    base_allocation,
                    align,
                    max_payload,
                    fast_zero,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), opt in any::<u32>()) {
        let _ = codec::parse_request(&bytes);
        let _ = codec::parse_option_header(&bytes);
        let _ = codec::parse_client_flags(&bytes);
        let _ = codec::parse_simple_reply(&bytes);
        let _ = codec::parse_chunk_header(&bytes);
        let _ = codec::parse_option_reply_header(&bytes);
        let _ = codec::parse_string(&bytes);
        let _ = codec::parse_option(opt, &bytes);
        for o in [OPT_EXPORT_NAME, OPT_INFO, OPT_GO, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_LIST] {
            let _ = codec::parse_option(o, &bytes);
        }
    }

    #[test]
    fn validate_never_panics(flags in any::<u16>(), command in 0u16..12, handle in any::<u64>(),
                             offset in any::<u64>(), length in any::<u32>(), p in params()) {
        let r = Request { flags, command, handle, offset, length };
        // Anything accepted lies inside the export and under the maximum.
        if let Ok(
            command::Command::Read { offset, len, .. } | command::Command::Write { offset, len, .. },
        ) = command::validate(&r, &p)
        {
            prop_assert!(offset.checked_add(u64::from(len)).is_some_and(|e| e <= p.size));
            prop_assert!(len <= p.max_payload);
        }
    }

    #[test]
    fn request_roundtrip(flags in any::<u16>(), command in any::<u16>(), handle in any::<u64>(),
                         offset in any::<u64>(), length in any::<u32>()) {
        let r = Request { flags, command, handle, offset, length };
        prop_assert_eq!(codec::parse_request(&codec::encode_request(&r)), Ok(r));
    }

    #[test]
    fn info_roundtrip(name in "[a-z0-9/._-]{0,64}", reqs in proptest::collection::vec(any::<u16>(), 0..10)) {
        let data = codec::encode_info_request(&name, &reqs);
        match codec::parse_option(OPT_GO, &data) {
            Ok(ClientOption::Go(i)) => {
                prop_assert_eq!(i.name, name);
                prop_assert_eq!(i.requests, reqs);
            }
            other => prop_assert!(false, "{:?}", other),
        }
        // Any truncation is an error, never a panic.
        for cut in 0..data.len() {
            prop_assert!(codec::parse_option(OPT_GO, &data[..cut]).is_err());
        }
    }

    #[test]
    fn meta_roundtrip(name in "[a-z]{0,16}", qs in proptest::collection::vec("[a-z:]{0,20}", 0..5)) {
        let refs: Vec<&str> = qs.iter().map(String::as_str).collect();
        let data = codec::encode_meta_request(&name, &refs);
        match codec::parse_option(OPT_LIST_META_CONTEXT, &data) {
            Ok(ClientOption::ListMetaContext(m)) => {
                prop_assert_eq!(m.export, name);
                prop_assert_eq!(m.queries, qs);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn error_chunks_are_self_consistent(err in any::<u32>(), msg in ".{0,400}", off in any::<u64>(), handle in any::<u64>()) {
        for c in [codec::chunk_error(handle, REPLY_FLAG_DONE, err, &msg),
                  codec::chunk_error_offset(handle, 0, err, &msg, off)] {
            let h = codec::parse_chunk_header(&c[..20]).unwrap();
            prop_assert_eq!(h.length as usize, c.len() - 20);
            let mlen = u16::from_be_bytes([c[24], c[25]]) as usize;
            prop_assert!(mlen + 6 <= h.length as usize);
            prop_assert!(std::str::from_utf8(&c[26..26 + mlen]).is_ok());
        }
    }
}
