//! Remote-write version negotiation (docs/wire.md, "Receiving"): the version of a request
//! by its `Content-Type`, and the written-counts headers of a 2.0 answer.

use axum::http::HeaderValue;
use axum::response::Response;

use crate::pipeline::{InputProtocol, Processed};

/// `proto=` of a 1.0 request.
pub const PROTO_V1: &str = "prometheus.WriteRequest";
/// `proto=` of a 2.0 request.
pub const PROTO_V2: &str = "io.prometheus.write.v2.Request";

/// The remote-write version a `Content-Type` names; `Err` carries the 415 reason.
/// `application/x-protobuf` without `proto=` is 1.0.
pub fn content_type(ct: &str) -> Result<InputProtocol, String> {
    let mut parts = ct.split(';').map(str::trim);
    let media = parts.next().unwrap_or("");
    if !media.eq_ignore_ascii_case("application/x-protobuf") {
        return Err(format!(
            "unsupported Content-Type {ct:?}: expected application/x-protobuf"
        ));
    }
    let mut protocol = InputProtocol::V1;
    for p in parts {
        let Some((key, value)) = p.split_once('=') else {
            continue;
        };
        if !key.trim().eq_ignore_ascii_case("proto") {
            continue;
        }
        protocol = match value.trim().trim_matches('"') {
            PROTO_V1 => InputProtocol::V1,
            PROTO_V2 => InputProtocol::V2,
            other => {
                return Err(format!(
                    "unsupported remote-write message {other:?}: promnorm accepts {PROTO_V1} (1.0) and {PROTO_V2} (2.0)"
                ));
            }
        };
    }
    Ok(protocol)
}

/// Adds the written-counts headers to a successful answer to a 2.0 request: everything
/// promnorm accepted for delivery, samples a configured rule dropped included (they are
/// counted in `promnorm_samples_dropped_total`).
pub fn written(mut resp: Response, protocol: InputProtocol, p: &Processed) -> Response {
    if protocol != InputProtocol::V2 || !resp.status().is_success() {
        return resp;
    }
    let h = resp.headers_mut();
    for (name, n) in [
        ("x-prometheus-remote-write-samples-written", p.samples_in),
        (
            "x-prometheus-remote-write-histograms-written",
            p.histograms_in,
        ),
        (
            "x-prometheus-remote-write-exemplars-written",
            p.exemplars_in,
        ),
    ] {
        h.insert(name, HeaderValue::from(n as u64));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_by_content_type() {
        use InputProtocol::*;
        let ok = |ct: &str| content_type(ct).ok();
        assert_eq!(ok("application/x-protobuf"), Some(V1));
        assert_eq!(ok("Application/X-Protobuf"), Some(V1));
        assert_eq!(
            ok("application/x-protobuf;proto=prometheus.WriteRequest"),
            Some(V1)
        );
        assert_eq!(
            ok("application/x-protobuf; proto=\"prometheus.WriteRequest\""),
            Some(V1)
        );
        assert_eq!(
            ok("application/x-protobuf;proto=io.prometheus.write.v2.Request"),
            Some(V2)
        );
        assert_eq!(
            ok("application/x-protobuf; charset=utf-8; Proto=\"io.prometheus.write.v2.Request\""),
            Some(V2)
        );
        for bad in [
            "",
            "application/json",
            "text/plain",
            "application/x-protobuf;proto=io.prometheus.write.v3.Request",
            "application/x-protobuf;proto=",
            "application/x-protobuf;proto=prometheus.writerequest",
        ] {
            let e = content_type(bad).expect_err(bad);
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
