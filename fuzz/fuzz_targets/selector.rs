//! Label selectors as they arrive in objects: JSON (the API) or YAML (the
//! offline tools), compiled and evaluated.
#![no_main]

use std::collections::BTreeMap;

use hostlb_api::{LabelSelector, Selector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let from_json = serde_json::from_str::<LabelSelector>(text).ok();
    let from_yaml = serde_saphyr::from_str::<LabelSelector>(text).ok();
    for selector in from_json.iter().chain(from_yaml.iter()) {
        check(selector);
    }
});

fn check(selector: &LabelSelector) {
    let Ok(compiled) = Selector::parse(selector) else {
        return;
    };
    let _ = compiled.to_string();
    let match_labels = selector.match_labels.clone().unwrap_or_default();
    let expressions = selector.match_expressions.as_deref().unwrap_or_default();
    // Labels the selector names, with each In value and none of the others.
    let mut labels = match_labels.clone();
    for e in expressions {
        if e.operator == "In"
            && let Some(v) = e.values.as_ref().and_then(|v| v.first())
        {
            labels.entry(e.key.clone()).or_insert_with(|| v.clone());
        }
    }
    compiled.matches(&labels);
    compiled.matches(&BTreeMap::new());
    if expressions.is_empty() {
        // matchLabels alone: exactly the objects carrying those labels.
        assert!(
            compiled.matches(&match_labels),
            "{selector:?} misses its own labels"
        );
        assert_eq!(compiled.matches(&BTreeMap::new()), match_labels.is_empty());
        assert_eq!(compiled.is_everything(), match_labels.is_empty());
    }
    // Compiling is deterministic.
    assert_eq!(Selector::parse(selector).as_ref(), Ok(&compiled));
}
