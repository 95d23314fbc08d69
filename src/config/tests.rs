use super::*;

#[test]
fn embedded_default_is_valid() {
    let c = Config::embedded_default();
    assert_eq!(c.listen, "0.0.0.0:9201");
    assert_eq!(c.backends[0].url, "http://127.0.0.1:9090/api/v1/write");
    c.check().unwrap();
}

#[test]
fn unknown_keys_are_rejected_with_position() {
    let err = Config::parse("listen: 0.0.0.0:1\nbogus: 1\n", "x.yaml").unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("x.yaml:2:"), "{msg}");
    assert!(msg.contains("bogus"), "{msg}");
}

#[test]
fn credentials_in_urls_never_show() {
    for (raw, shown) in [
        ("http://u:p%40ss@h/api", "http://u:<secret>@h/api"),
        ("http://u:p@ss@h/api", "http://u:<secret>@h/api"),
        ("http://u:s3cr/et@h/api", "http://u:<secret>@h/api"),
        ("http://TOKEN@h/api", "http://<secret>@h/api"),
        ("u:pass@h:9090/api", "u:<secret>@h:9090/api"),
        ("http://h/api", "http://h/api"),
    ] {
        assert_eq!(redact_url(raw), shown, "{raw}");
    }
    let err = parse_backend_url("http://u:s3cr/et@h/api")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("percent-encode") && !err.contains("s3cr"),
        "{err}"
    );
    let err = parse_backend_url("u:pass@h:9090/api")
        .unwrap_err()
        .to_string();
    assert!(!err.contains("pass"), "{err}");
    assert!(parse_backend_url("http://h:99999/api").is_err());
    let ok = parse_backend_url("http://u:p%2Fw@h/api").unwrap();
    assert_eq!(ok.userinfo, Some(("u".into(), "p/w".into())));
    assert_eq!(ok.uri.host(), Some("h"));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("5d").is_err());
}

#[test]
fn errors_are_typed_where_a_caller_can_act() {
    assert!(matches!(
        parse_duration("5"),
        Err(DurationError::NoUnit { .. })
    ));
    assert!(matches!(
        parse_duration("5d"),
        Err(DurationError::BadUnit { ref unit, .. }) if unit == "d"
    ));
    assert!(matches!(parse_duration(""), Err(DurationError::Empty)));
    assert!(matches!(
        parse_backend_url("http://h:99999/api"),
        Err(UrlError::BadPort { .. })
    ));
    assert!(matches!(
        parse_backend_url("ftp://h/api"),
        Err(UrlError::NotHttp { .. })
    ));
    assert!(matches!(parse_listen("9201"), Err(ListenError::NoPort)));

    let text = "backends:\n  - url: http://a/api/v1/write\n    name: x\n  - url: http://b/api/v1/write\n    name: x\n";
    let err = Config::parse(text, "dup.yaml")
        .unwrap()
        .check()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::DuplicateBackend { ref name, .. } if name == "x"),
        "{err:?}"
    );
    assert_eq!(err.key(), Some("name"));
    assert!(
        err.to_string().starts_with("dup.yaml:5:11: two backends"),
        "{err}"
    );

    let text = "listen: nowhere\n";
    let err = Config::parse(text, "l.yaml").unwrap().check().unwrap_err();
    assert!(matches!(err, ConfigError::Listen { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "l.yaml:1:9: listen \"nowhere\": expected host:port or :port"
    );

    let text = "ingest_auth:\n  bearer_token: {env: PROMNORM_TEST_SURELY_UNSET}\n";
    let err = Config::parse(text, "s.yaml").unwrap().check().unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Secret {
                source: SecretError::EnvUnset { .. },
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn tenancy_without_default_warns_and_max_concurrent_requests_is_checked() {
    let warned = |text: &str| {
        Config::parse(text, "t.yaml")
            .unwrap()
            .warnings()
            .into_iter()
            .any(|w| w.contains("tenancy without default"))
    };
    let b = "backends:\n  - url: http://x/api/v1/push\n";
    assert!(warned(&format!("tenancy: {{label: tenant}}\n{b}")));
    assert!(!warned(&format!("tenancy: {{default: anonymous}}\n{b}")));
    assert!(!warned(b), "no tenancy");
    assert!(
        !warned(
            "tenancy: {}\nbackends:\n  - url: http://x/api/v1/push\n    headers: {x-scope-orgid: a}\n"
        ),
        "a fixed tenant header"
    );
    assert!(!warned(
        "tenancy: {}\nbackends:\n  - url: http://x/api/v1/push\n    tenancy: {enabled: false}\n"
    ));
    let c = Config::parse(b, "t.yaml").unwrap();
    assert_eq!(c.backends[0].max_concurrent_requests, 64);
    let err = Config::parse(
        "backends:\n  - url: http://x/api/v1/push\n    max_concurrent_requests: 0\n",
        "m.yaml",
    )
    .unwrap()
    .check()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "m.yaml:3:30: backend default: max_concurrent_requests must be from 1 to 10000"
    );
}
