//! Fuzzes the handshake parsers: client flags, option headers, option data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd::codec;

fuzz_target!(|data: &[u8]| {
    let _ = codec::parse_client_flags(data.get(..4).unwrap_or(data));
    let mut rest = data;
    // A stream of options, as a client would send them.
    while rest.len() >= 16 {
        let Ok(h) = codec::parse_option_header(&rest[..16]) else {
            // Still exercise the option parser on raw bytes.
            let opt = u32::from_be_bytes(rest[8..12].try_into().unwrap());
            let _ = codec::parse_option(opt % 16, &rest[16..]);
            return;
        };
        rest = &rest[16..];
        let n = (h.length as usize).min(rest.len());
        let _ = codec::parse_option(h.option, &rest[..n]);
        rest = &rest[n..];
    }
    let _ = codec::parse_option_reply_header(data);
});
