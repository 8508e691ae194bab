//! The IDAP parser on arbitrary bytes, as a request and as a response. A document that
//! parses must survive a round trip: written out and parsed again it must parse, to the
//! same model.
#![no_main]

use aqgate_proto::idap::{Limits, check_method_header, parse_request, parse_response, write_request, write_response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    if let Ok(req) = parse_request(data, &limits) {
        let _ = check_method_header(
            &format!("http://ns.oracle.com/AQ/schemas/access#{}", req.body.method_name()),
            &req.body,
        );
        let written = write_request(&req);
        let again = match parse_request(written.as_bytes(), &limits) {
            Ok(again) => again,
            Err(e) => panic!("a written request does not parse: {e}\n{written}"),
        };
        assert_eq!(again, req, "request changed in a round trip:\n{written}");
    }
    if let Ok(resp) = parse_response(data, &limits) {
        let written = write_response(&resp);
        let again = match parse_response(written.as_bytes(), &limits) {
            Ok(again) => again,
            Err(e) => panic!("a written response does not parse: {e}\n{written}"),
        };
        assert_eq!(again, resp, "response changed in a round trip:\n{written}");
    }
    // The method header check on arbitrary text, against a fixed body.
    if let Ok(text) = std::str::from_utf8(data)
        && text.len() < 512
    {
        let _ = check_method_header(text, &aqgate_proto::idap::Request::Commit);
    }
});
