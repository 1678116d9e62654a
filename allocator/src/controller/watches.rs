//! The watches: each kind's stream into one input channel, and telling their first listing apart from later changes.

use super::Input;
use futures::{StreamExt, stream::BoxStream};
use kube::Api;
use kube::runtime::reflector::{self};
use kube::runtime::{WatchStreamExt, watcher};

/// A watch feeding a store, as one stream of inputs; errors are logged and
/// retried with backoff by the watcher.
pub(super) fn watch_into<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    wrap: fn(watcher::Event<K>) -> Input,
    index: usize,
) -> BoxStream<'static, Input>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default())
        .backoff(hostlb_api::watch::WatchBackoff::spread())
        .reflect(writer)
        .map(move |ev| match ev {
            Ok(e) => wrap(e),
            Err(e) => Input::WatchFailed(index, e.to_string()),
        })
        .boxed()
}

pub(super) fn kind_index(i: &Input) -> usize {
    match i {
        Input::Service(_) => 0,
        Input::Pool(_) => 1,
        Input::Namespace(_) => 2,
        Input::Advertisement(_) => 3,
        Input::Agent(_) => AGENTS,
        Input::WatchFailed(k, _) => *k,
    }
}

/// The NodeAgent watch's index: outside [`KINDS`], since readiness and
/// the decisions never wait for it.
pub(super) const AGENTS: usize = 4;

pub(super) const KINDS: [&str; 4] = ["Service", "IPAddressPool", "Namespace", "L2Advertisement"];

/// `Init` comes before a list request is even sent; anything else shows
/// the server answered.
pub(super) fn is_answer<K>(e: &watcher::Event<K>) -> bool {
    !matches!(e, watcher::Event::Init)
}

pub(super) fn is_init_done<K>(e: &watcher::Event<K>) -> bool {
    matches!(e, watcher::Event::InitDone)
}
