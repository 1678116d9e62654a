//! Release builds of the agent lay the code it runs from start to rest
//! together (`link/hot.ld`, made by `link/hot.py`): spread over the
//! binary, that code kept nearly all of the text resident, since the kernel
//! maps the 64 KiB around each page touched.

fn main() {
    println!("cargo::rerun-if-changed=link/hot.ld");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if release && linux {
        let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
        println!("cargo::rustc-link-arg-bin=lbnodeagent=-Wl,-T,{dir}/link/hot.ld");
    }
}
