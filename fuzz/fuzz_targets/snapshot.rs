//! YAML dumps as `lbnodeagent simulate` and `allocator plan` read them: the
//! snapshot parser, then both offline computations on whatever it kept.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hostlb_api::snapshot::Snapshot;
use libfuzzer_sys::fuzz_target;

/// Both commands read files; one per process, rewritten for every input.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("hostlb-fuzz-snapshot-{}.yaml", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut snapshot = Snapshot::default();
    if snapshot.add_str(text, "fuzz.yaml").is_err() {
        return;
    }
    let path = scratch();
    std::fs::write(path, data).expect("scratch file");

    for output in [
        lbnodeagent::simulate::Output::Json,
        lbnodeagent::simulate::Output::Table,
    ] {
        let opts = lbnodeagent::simulate::Options {
            files: vec![path.clone()],
            output,
            ..Default::default()
        };
        let rendered = lbnodeagent::simulate::run(&opts).expect("parsed once, so it parses again");
        if output == lbnodeagent::simulate::Output::Json {
            serde_json::from_str::<serde_json::Value>(&rendered)
                .expect("simulate --output json is JSON");
        }
    }
    for output in [
        hostlb_allocator::plan::Output::Json,
        hostlb_allocator::plan::Output::Table,
    ] {
        let opts = hostlb_allocator::plan::Options {
            files: vec![path.clone()],
            output,
            ..Default::default()
        };
        let plan = hostlb_allocator::plan::run(&opts).expect("parsed once, so it parses again");
        if output == hostlb_allocator::plan::Output::Json {
            serde_json::from_str::<serde_json::Value>(&plan.text)
                .expect("plan --output json is JSON");
        }
    }
});
