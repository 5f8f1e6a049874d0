//! `--cluster`: the campaign against the clustered services that `scripts/services.sh`
//! runs on this machine, at the addresses it gives them (`postgres-pair`: a primary on
//! 5433 with a synchronous standby on 5434; `nats-cluster`: three nodes on 4251–4253).

use anyhow::ensure;

use super::ChaosArgs;

const PRIMARY: &str = "postgres://postgres@127.0.0.1:5433/postgres";
const STANDBY: &str = "postgres://postgres@127.0.0.1:5434/postgres";
const NATS_SEEDS: &str = "nats://127.0.0.1:4251,nats://127.0.0.1:4252,nats://127.0.0.1:4253";
const FAILOVER: &str = "scripts/services.sh failover postgres-pair";
const RESTART_LEADER: &str = "scripts/services.sh restart nats-cluster";

/// `args` pointed at the clustered services, with the failover and the leader's
/// restarts in its plan.
pub(super) fn clustered(args: ChaosArgs) -> anyhow::Result<ChaosArgs> {
    ensure!(
        args.database_url == crate::bench::DEFAULT_PG_URL,
        "--cluster runs on the pair's primary ({PRIMARY}): leave --database-url (and \
         ONCEBOX_PG_URL) unset"
    );
    let broker_restarts = if args.broker_restarts == 0 {
        2
    } else {
        args.broker_restarts
    };
    Ok(ChaosArgs {
        database_url: PRIMARY.to_owned(),
        standby_url: Some(STANDBY.to_owned()),
        failover: Some(FAILOVER.to_owned()),
        broker_url: NATS_SEEDS.to_owned(),
        stream_replicas: 3,
        restart_broker: Some(RESTART_LEADER.to_owned()),
        broker_restarts,
        ..args
    })
}
