use relay_core::secret::Secret;

use super::*;

#[test]
fn pipeline_defaults_are_the_pipelines_own() {
    let core = PipelineConfig::default();
    let relay: PipelineSettings = figment::Figment::new()
        .merge(figment::providers::Toml::string("reconnect_max = \"3s\""))
        .extract()
        .expect("a partial [relay]");
    let loaded = relay.pipeline_config();
    assert_eq!(
        (
            loaded.max_in_flight,
            loaded.checkpoint_interval,
            loaded.idle_checkpoint_interval,
            loaded.retry_max,
            loaded.no_stream_grace,
            loaded.drain_timeout,
            loaded.dead_letter_subject,
        ),
        (
            core.max_in_flight,
            core.checkpoint_interval,
            core.idle_checkpoint_interval,
            core.retry_max,
            core.no_stream_grace,
            core.drain_timeout,
            core.dead_letter_subject,
        )
    );
    assert_eq!(relay.reconnect_max, Duration::from_secs(3));
    assert_eq!(relay.standby_poll_interval, Duration::from_secs(1));
}

/// Every secret the configuration can hold, from the file and the environment: none is in
/// `Debug` (plain or pretty) or in the serialized configuration (`validate`, `config
/// print`).
#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn no_secret_is_printed_or_serialized() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            r#"
            [postgres]
            url = "postgres://relay:pg-url-secret@db:5432/app"
            password = "pg-secret"

            [nats]
            url = "nats://relay:nats-url-secret@broker:4222"
            user = "relay"
            password = "nats-secret"
            token = "token-secret"
            nkey_seed = "SUAseed-secret"
            "#,
        )?;
        jail.set_env("RELAY_NATS__TOKEN", "env-token-secret");
        let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
        assert_eq!(
            c.nats.token.as_ref().map(Secret::expose),
            Some("env-token-secret")
        );
        let shown = format!(
            "{c:?}\n{c:#?}\n{}\n{}",
            serde_json::to_string(&c).expect("serializes"),
            serde_json::to_string_pretty(&c).expect("serializes"),
        );
        for secret in [
            "pg-url-secret",
            "pg-secret",
            "nats-url-secret",
            "nats-secret",
            "token-secret",
            "SUAseed-secret",
        ] {
            assert!(!shown.contains(secret), "{secret} in:\n{shown}");
        }
        let json = serde_json::to_value(&c).expect("serializes");
        assert_eq!(
            json["postgres"]["url"],
            "postgres://relay:<redacted>@db:5432/app"
        );
        for (section, key) in [
            ("postgres", "password"),
            ("nats", "password"),
            ("nats", "token"),
            ("nats", "nkey_seed"),
        ] {
            assert_eq!(json[section][key], "<redacted>", "{section}.{key}");
        }
        Ok(())
    });
}

#[test]
fn defaults_need_no_file() {
    let c = RelayConfig::default();
    let c = RelayConfig {
        outbox: default_outbox(),
        ..c
    };
    c.validate().unwrap();
    let no_poll = RelayConfig {
        relay: PipelineSettings {
            standby_poll_interval: Duration::ZERO,
            ..PipelineSettings::default()
        },
        ..c.clone()
    };
    let err = no_poll.validate().unwrap_err().to_string();
    assert!(
        err.ends_with("[relay] standby_poll_interval must be positive"),
        "{err}"
    );
    assert_eq!(
        c.sample_subjects(),
        [("public.outbox".to_owned(), "outbox.x.x".to_owned())]
    );
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn messages_are_parsed_checked_and_sampled() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            r#"
            [[messages]]
            prefix = "outbox"

            [[messages]]
            prefix = "audit"
            subject = "audit.{kind}"
            subjects = ["audit.>"]
            allow_non_transactional = true
            "#,
        )?;
        let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
        assert_eq!(c.messages.len(), 2);
        assert_eq!(c.messages[0].subjects, ["outbox.>"]);
        assert!(!c.messages[0].allow_non_transactional);
        assert!(c.messages[1].allow_non_transactional);
        let samples = c.sample_subjects();
        assert!(samples.contains(&(
            "[[messages]] prefix \"outbox\"".to_owned(),
            "outbox.x".to_owned()
        )));
        assert!(samples.contains(&(
            "[[messages]] prefix \"audit\"".to_owned(),
            "audit.x".to_owned()
        )));
        c.router().expect("router");

        jail.create_file(
            "twice.toml",
            "[[messages]]\nprefix = \"a\"\n[[messages]]\nprefix = \"a\"\n",
        )?;
        let err = RelayConfig::load(Some(Path::new("twice.toml"))).unwrap_err();
        assert!(
            err.to_string()
                .contains("[[messages]] prefix `a` is configured twice"),
            "{err}"
        );
        jail.create_file(
            "typo.toml",
            "[[messages]]\nprefix = \"a\"\nallow_nontransactional = true\n",
        )?;
        let err = RelayConfig::load(Some(Path::new("typo.toml"))).unwrap_err();
        assert!(
            format!("{err:?}").contains("allow_nontransactional"),
            "{err:?}"
        );
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn cleanup_is_per_table_and_strict() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            r#"
            [[outbox]]
            table = "public.outbox"
            [outbox.cleanup]
            mode = "delete"
            retain = "3d"
            batch_size = 500

            [[outbox]]
            table = "public.polled"
            payload = "*"
            [outbox.cleanup]
            mode = "mark"
            status_column = "status"
            sent_at_column = "sent_at"

            [[outbox]]
            table = "public.plain"
            "#,
        )?;
        let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
        assert_eq!(c.outbox.len(), 3);
        assert_eq!(c.outbox[1].payload, "*");
        let cleanup: Vec<_> = c
            .outbox
            .cleanup()
            .map(|(t, s)| (t.table.clone(), s.mode, s.retain(), s.batch_size))
            .collect();
        assert_eq!(
            cleanup,
            [
                (
                    "public.outbox".to_owned(),
                    CleanupMode::Delete,
                    Duration::from_secs(3 * 86400),
                    500
                ),
                (
                    "public.polled".to_owned(),
                    CleanupMode::Mark,
                    Duration::ZERO,
                    1000
                ),
            ]
        );
        assert!(c.outbox.cleanup_of("public", "plain").is_none());
        jail.create_file(
            "zero.toml",
            "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nretain = \"0s\"\n",
        )?;
        let zero = RelayConfig::load(Some(Path::new("zero.toml"))).expect("loads");
        let retain = zero.outbox.cleanup().map(|(_, s)| s.retain()).next();
        assert_eq!(retain, Some(Duration::ZERO));
        jail.create_file(
            "epoch.toml",
            "[[outbox]]\ntable = 'public.\"watermill.orders\"'\nrow_filter = \"kind = 'a'\"\n[outbox.cleanup]\nmode = \"delete\"\nage_column = \"creation_time\"\nage_unit = \"ms\"\n",
        )?;
        let epoch = RelayConfig::load(Some(Path::new("epoch.toml"))).expect("loads");
        let (table, settings) = epoch.outbox.cleanup().next().expect("a cleanup");
        assert!(table.is_table("public", "watermill.orders"));
        assert_eq!(
            settings.age_spec().unit,
            Some(relay_cleanup::EpochUnit::Milliseconds)
        );
        assert_eq!(
            epoch.outbox.cleanup_of("public", "watermill.orders"),
            Some(settings)
        );
        assert_eq!(
            epoch.published_tables()[0].row_filter.as_deref(),
            Some("kind = 'a'")
        );
        let plans = c
            .outbox
            .cleanup_of("public", "polled")
            .map(|s| s.row_plans("public", "polled", None))
            .expect("a cleanup");
        assert_eq!(plans.len(), 1, "mark without delete_after only marks");
        assert_eq!(plans[0].batch_size, 1000);
        jail.create_file(
            "mark_delete.toml",
            "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"mark\"\nsent_at_column = \"sent_at\"\nretain = \"1h\"\ndelete_after = \"2d\"\n",
        )?;
        let both = RelayConfig::load(Some(Path::new("mark_delete.toml"))).expect("loads");
        let plans: Vec<_> = both
            .outbox
            .cleanup()
            .flat_map(|(_, s)| s.row_plans("public", "t", None))
            .map(|p| (p.action, p.retain))
            .collect();
        assert_eq!(
            plans,
            [
                (
                    relay_cleanup::CleanupAction::Mark {
                        status: None,
                        sent_at: Some("sent_at".into())
                    },
                    Duration::from_secs(3600)
                ),
                (
                    relay_cleanup::CleanupAction::Delete,
                    Duration::from_secs(2 * 86400)
                ),
            ],
            "marked after retain, deleted after delete_after"
        );
        // Printed back where it was written.
        let json = serde_json::to_value(&c).expect("serializes");
        assert_eq!(json["outbox"][0]["cleanup"]["mode"], "delete");
        assert_eq!(json["outbox"][0]["cleanup"]["retain"], "3days");
        assert!(json["outbox"][2].get("cleanup").is_none());

        for (file, text, needle) in [
            (
                "typo.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nretian = \"1d\"\n",
                "retian",
            ),
            (
                "mapping.toml",
                "[[outbox]]\ntable = \"t\"\nsubjekt = \"x\"\n",
                "subjekt",
            ),
            (
                "mode.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"truncate\"\n",
                "truncate",
            ),
            (
                "mark.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"mark\"\n",
                "needs status_column",
            ),
            (
                "delete.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nstatus_column = \"s\"\n",
                "are for mode = \"mark\"",
            ),
            (
                "delete_after.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\ndelete_after = \"1d\"\n",
                "delete_after is for mode = \"mark\"",
            ),
            (
                "delete_before_retain.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"mark\"\nsent_at_column = \"s\"\nretain = \"2d\"\ndelete_after = \"1d\"\n",
                "delete_after must be at least retain",
            ),
            (
                "unit_and_zone.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nage_unit = \"ms\"\nage_time_zone = \"UTC\"\n",
                "exclude each other",
            ),
            (
                "unit.toml",
                "[[outbox]]\ntable = \"t\"\n[outbox.cleanup]\nmode = \"delete\"\nage_unit = \"minutes\"\n",
                "minutes",
            ),
            (
                "drop_filtered.toml",
                "[[outbox]]\ntable = \"t\"\nrow_filter = \"a = 1\"\n[outbox.cleanup]\nmode = \"drop-partitions\"\n",
                "also those row_filter leaves out",
            ),
            (
                "escaping_filter.toml",
                "[[outbox]]\ntable = \"t\"\nrow_filter = \"a = '1') OR (true\"\n",
                "row_filter `a = '1') OR (true` closes a parenthesis it did not open: give one condition",
            ),
            (
                "two_statements_filter.toml",
                "[[outbox]]\ntable = \"t\"\nrow_filter = \"true; DROP TABLE t\"\n",
                "holds a `;`",
            ),
            (
                "three_parts.toml",
                "[[outbox]]\ntable = \"public.orders.created\"\n",
                "table = 'public.\"orders.created\"'",
            ),
        ] {
            jail.create_file(file, text)?;
            let err = RelayConfig::load(Some(Path::new(file))).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(shown.contains(needle), "{file}: {shown}");
        }
        Ok(())
    });
}

#[test]
fn dead_letter_subject_is_checked_and_sampled() {
    let mut c = RelayConfig {
        outbox: default_outbox(),
        ..RelayConfig::default()
    };
    c.relay.dead_letter_subject = Some("outbox.dlq".into());
    c.validate().unwrap();
    assert_eq!(
        c.sample_subjects().last(),
        Some(&(
            "[relay] dead_letter_subject".to_owned(),
            "outbox.dlq".to_owned()
        ))
    );
    assert_eq!(
        c.relay.pipeline_config().dead_letter_subject.as_deref(),
        Some("outbox.dlq")
    );
    for bad in [
        "",
        "outbox.>",
        "outbox.*",
        "$JS.API.X",
        "outbox..dlq",
        "dlq.{id}",
        "a b",
    ] {
        c.relay.dead_letter_subject = Some(bad.into());
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("dead_letter_subject"), "{bad}: {err}");
    }
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn file_and_env_merge_and_unknown_keys_are_refused() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            r#"
            [postgres]
            url = "postgres://relay@db:5432/app"
            slot = "orders_relay"

            [nats]
            stream = "ORDERS"

            [[outbox]]
            table = "public.notification_outbox"
            subject = "notifications.{tenant_id}.{event_type}"
            payload = "*"
            headers = { "Tenant-Id" = "tenant_id" }
            "#,
        )?;
        jail.set_env("RELAY_POSTGRES__PASSWORD", "from-env");
        jail.set_env("RELAY_NATS__URL", "nats://broker:4222");
        jail.set_env("RELAY_CONFIG", "relay.toml");
        jail.set_env("RELAY_LOG_FORMAT", "json");
        jail.set_env("RELAY_TEST_NATS_SERVER", "/usr/bin/nats-server");
        let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
        assert_eq!(c.postgres.slot, "orders_relay");
        assert_eq!(
            c.postgres.password.as_ref().map(Secret::expose),
            Some("from-env")
        );
        assert_eq!(c.nats.url, "nats://broker:4222");
        assert_eq!(c.outbox[0].payload, "*");
        assert_eq!(c.outbox[0].event_id, "id");
        assert!(
            !format!("{c:?}").contains("from-env"),
            "password redacted in Debug"
        );
        assert_eq!(c.relay, PipelineSettings::default(), "[relay] left out");

        jail.create_file("typo.toml", "[postgres]\nslott = \"x\"\n")?;
        let err = RelayConfig::load(Some(Path::new("typo.toml"))).unwrap_err();
        let text = format!("{:?}", err);
        assert!(text.contains("slott"), "{text}");

        jail.create_file("badslot.toml", "[postgres]\nslot = \"Bad-Slot\"\n")?;
        let err = RelayConfig::load(Some(Path::new("badslot.toml"))).unwrap_err();
        assert!(err.to_string().contains("Bad-Slot"), "{err}");
        Ok(())
    });
}

/// A fast batch holds its first message until the next one or the transaction's end: a window
/// of one would stop the relay reading before either, for good and without an error.
#[test]
fn fast_batch_needs_a_window_of_two() {
    let mut c = RelayConfig {
        outbox: default_outbox(),
        ..RelayConfig::default()
    };
    c.nats.publish_mode = relay_nats::PublishMode::FastBatch;
    c.relay.max_in_flight = 1;
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("max_in_flight = 1")
            && err.contains("fast-batch")
            && err.contains("at least 2"),
        "{err}"
    );
    c.relay.max_in_flight = 2;
    c.validate().unwrap();
    c.nats.publish_mode = relay_nats::PublishMode::PerMessage;
    c.relay.max_in_flight = 1;
    c.validate().unwrap();
}

/// `[nats] domain` is one subject token of `$JS.<domain>.API`: anything else is refused at load,
/// naming the key and the fix.
#[test]
fn a_jetstream_domain_is_one_token() {
    let mut c = RelayConfig {
        outbox: default_outbox(),
        ..RelayConfig::default()
    };
    c.nats.domain = Some("hub".into());
    c.validate().unwrap();
    for bad in ["", "eu.west", "hub leaf", "*", ">"] {
        c.nats.domain = Some(bad.into());
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("[nats] domain") && err.contains("one subject token"),
            "{bad:?}: {err}"
        );
    }
}

/// The framework-shape keys of `[[outbox]]` are read from TOML, checked at load (a bad JSON
/// Pointer names the table and the key), and a `{levels:…}` subject adds a two-level sample for
/// the stream check.
#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn envelope_keys_are_read_checked_and_sampled() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            r#"
            [[outbox]]
            table = "cap.published"
            event_id = "Id"
            subject = "cap.{levels:Name}"
            payload = "Content"
            payload_pointer = "/Value"
            headers = {}
            headers_json = "Content"
            headers_json_pointer = "/Headers"
            "#,
        )?;
        let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
        assert_eq!(c.outbox[0].payload_pointer.as_deref(), Some("/Value"));
        assert_eq!(c.outbox[0].headers_json.as_deref(), Some("Content"));
        assert_eq!(
            c.outbox[0].headers_json_pointer.as_deref(),
            Some("/Headers")
        );
        c.validate().expect("valid");
        let samples: Vec<String> = c.sample_subjects().into_iter().map(|(_, s)| s).collect();
        assert_eq!(samples, ["cap.x", "cap.x.x"]);

        jail.create_file(
            "bad.toml",
            r#"
            [[outbox]]
            table = "cap.published"
            payload = "Content"
            payload_pointer = "Content.Value"
            "#,
        )?;
        let err = RelayConfig::load(Some(Path::new("bad.toml")))
            .and_then(|c| c.validate().map(|()| c))
            .unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("payload_pointer"), "{text}");
        assert!(text.contains("cap.published"), "{text}");
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn presets_fill_what_the_entry_leaves_out() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "relay.toml",
            r#"
            [[outbox]]
            preset = "debezium"
            subject = "events.{type}"
            [outbox.headers]
            X-Tenant = "aggregateid"
            Outbox-Event-Type = "type?"

            [[outbox]]
            preset = "debezium"
            table = "shop.outboxevent"
            [outbox.cleanup]
            mode = "delete"
            "#,
        )?;
        let c = RelayConfig::load(Some(Path::new("relay.toml"))).expect("loads");
        let (first, second) = (&c.outbox[0], &c.outbox[1]);
        // The entry's own keys win; the rest is the preset's.
        assert_eq!(first.subject, "events.{type}");
        assert_eq!(first.table, "public.outboxevent");
        assert_eq!(first.headers["X-Tenant"], "aggregateid");
        assert_eq!(first.headers["Outbox-Event-Type"], "type?");
        assert_eq!(first.headers["Outbox-Aggregate-Id"], "aggregateid");
        assert_eq!(c.outbox.preset_of(0, "table"), Some("debezium"));
        assert_eq!(c.outbox.preset_of(0, "subject"), None);
        assert_eq!(c.outbox.preset_of(0, "headers.X-Tenant"), None);
        assert_eq!(
            c.outbox.preset_of(0, "headers.Outbox-Aggregate-Id"),
            Some("debezium")
        );
        // Cleanup defaults only where the entry turned cleanup on.
        assert!(c.outbox.cleanup_of("public", "outboxevent").is_none());
        assert_eq!(second.table, "shop.outboxevent");
        let cleanup = c.outbox.cleanup().next().expect("cleanup").1;
        assert_eq!(cleanup.age_column, "timestamp");
        assert_eq!(
            c.outbox.preset_of(1, "cleanup.age_column"),
            Some("debezium")
        );
        // What config print shows: the preset by name.
        let printed = serde_json::to_value(&c.outbox).expect("serializes");
        assert_eq!(printed[0]["preset"], "debezium");
        Ok(())
    });
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn a_preset_says_which_keys_it_needs_and_unknown_ones_are_named() {
    figment::Jail::expect_with(|jail| {
        jail.create_file("needs.toml", "[[outbox]]\npreset = \"watermill\"\n")?;
        let error = chain(RelayConfig::load(Some(Path::new("needs.toml"))).expect_err("needs"));
        assert!(
            error.contains("preset `watermill` needs `subject`")
                && error.contains("`table` (Watermill keeps one table per topic"),
            "{error}"
        );
        jail.create_file("unknown.toml", "[[outbox]]\npreset = \"axon\"\n")?;
        let error = chain(RelayConfig::load(Some(Path::new("unknown.toml"))).expect_err("unknown"));
        assert!(
            error.contains("unknown preset `axon`") && error.contains("cap, debezium"),
            "{error}"
        );
        Ok(())
    });
}

/// An error and its causes, as the relay prints them.
fn chain(error: ConfigError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Every preset, with the keys it needs, makes a mapping the relay accepts: its keys are the
/// relay's own, its subject template and pointers parse.
#[test]
#[allow(clippy::result_large_err)] // figment's Jail API
fn every_preset_makes_a_valid_mapping() {
    for name in presets::names() {
        let needs = match name {
            "watermill" => {
                "table = 'public.\"watermill_orders.created\"'\nsubject = \"orders.created\"\n"
            }
            "spring-modulith" => "row_filter = \"listener_id = 'outbox-relay'\"\n",
            _ => "",
        };
        // Mark mode where the framework marks sent rows (the others delete them).
        let marks = matches!(name, "cap" | "eventuate" | "spring-modulith" | "brighter");
        for mode in ["delete", "mark"]
            .into_iter()
            .filter(|m| marks || *m == "delete")
        {
            figment::Jail::expect_with(|jail| {
                jail.create_file(
                "relay.toml",
                &format!("[[outbox]]\npreset = \"{name}\"\n{needs}[outbox.cleanup]\nmode = \"{mode}\"\n"),
            )?;
                let c = RelayConfig::load(Some(Path::new("relay.toml")));
                let c = c.unwrap_or_else(|e| panic!("preset {name}: {}", chain(e)));
                assert_eq!(c.outbox.len(), 1);
                c.outbox[0]
                    .validate()
                    .unwrap_or_else(|e| panic!("preset {name}: {e}"));
                Ok(())
            });
        }
    }
}

/// The audit reads the WAL `replay_retention` keeps; heal without an audit is a mistake.
#[test]
fn the_audit_needs_replay_retention_and_heal_needs_the_audit() {
    let mut c = RelayConfig {
        outbox: default_outbox(),
        ..RelayConfig::default()
    };
    c.relay.audit_interval = Some(std::time::Duration::from_secs(60));
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("audit_interval needs [relay] replay_retention"),
        "{err}"
    );
    c.relay.replay_retention = Some(relay_core::trail::ReplayRetention::Bytes(1 << 30));
    c.validate().unwrap();
    c.relay.audit_interval = Some(std::time::Duration::ZERO);
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("must be positive")
    );
    c.relay.audit_interval = None;
    c.relay.audit_heal = true;
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("audit_heal = true needs [relay] audit_interval"),
        "{err}"
    );
}
