//! `systemctl reload`: the configuration read again, and what of it
//! may change without a restart.

use tracing::{error, info, warn};

use super::Agent;
use super::config::AgentConfig;
use super::core::Input;
use super::record::config_hash;
use super::start::settings;
use crate::addrs::AddressBackend;
use crate::gossip::GossipKeys;

impl<B: AddressBackend + 'static> Agent<B> {
    /// SIGHUP: the new settings for the core and the links read again (the
    /// virtual interface may have another name), as one input.
    pub(super) async fn reload(&mut self) -> Option<Input> {
        let new = match AgentConfig::load(&self.config_path) {
            Ok(new) => new,
            Err(e) => {
                error!(error = %e, "reload refused; keeping the running config");
                return None;
            }
        };
        // Compared as the running agent resolved them at start: an unset
        // advertise address is the one it worked out, not a change.
        let mut new = new;
        new.gossip.listen = new.gossip.usable_listen();
        if new.gossip.advertise.is_none() && new.gossip.listen == self.cfg.gossip.listen {
            new.gossip.advertise = self.cfg.gossip.advertise;
        }
        let restart = self.cfg.restart_only_changes(&new);
        if !restart.is_empty() {
            warn!(keys = ?restart, "reloaded; these settings take effect only after a restart");
        }
        match GossipKeys::load(&new.gossip.key_file) {
            Ok(keys) => self.gossip.transport.set_keys(keys),
            Err(e) => {
                error!(error = %e, "reload refused: the gossip key file is unusable; keeping the running config");
                return None;
            }
        }
        self.ensure_virtual = new.announce.virtual_interface != self.cfg.announce.virtual_interface;
        self.cfg.announce = new.announce;
        self.cfg.gossip.seeds = new.gossip.seeds;
        self.cfg.gossip.key_file = new.gossip.key_file;
        self.cfg.firewall = new.firewall;
        if new.upstream != self.cfg.upstream {
            self.upstream = new
                .upstream
                .enabled
                .then(|| crate::announce::gateway::GatewayProbe::start(new.upstream.lost_after));
            // Turned off, or started afresh (its checks start as never
            // answered, and report only changes from none lost): no gateway
            // is lost until they say so.
            self.telemetry.gateways_lost.set(0);
            self.step(Input::Upstream(Default::default())).await;
            if let Some(u) = &self.upstream {
                u.set(super::kernel::gateway_probes(self.core.links()));
            }
            self.cfg.upstream = new.upstream;
        }
        self.config_hash = config_hash(&self.cfg);
        self.link_reads.set_config(&self.cfg);
        info!(config = %self.config_path.display(), "config reloaded");
        let wire = self.core.settings().wire;
        Some(Input::Reloaded {
            settings: settings(&self.cfg, wire),
            links: self.read_links().await,
        })
    }
}
