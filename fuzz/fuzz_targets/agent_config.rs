//! The agent's config file: any text, as `lbnodeagent check` and a SIGHUP
//! reload read it.
#![no_main]

use std::path::Path;

use lbnodeagent::agent::AgentConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/etc/lbnodeagent/lbnodeagent.toml");
    let parsed = AgentConfig::parse(text, path, || "node1".to_string());
    match parsed {
        Ok(config) => {
            // Deterministic, and a reload of the same file changes nothing.
            let again =
                AgentConfig::parse(text, path, || "node1".to_string()).expect("parsed once");
            assert_eq!(config, again);
            assert!(config.restart_only_changes(&again).is_empty());
            assert!(!config.node_name.is_empty());
        }
        Err(error) => {
            // Every refusal renders (it is what `check` prints).
            let _ = error.to_string();
        }
    }
});
