//! The command line of `aqgate admin …` (clap): the subcommands and their flags, and
//! [`run`], which opens the store a command names and prints its table or does its change.

use std::path::PathBuf;

use aqgate_core::topology::Topology;

/// The database a command works on.
#[derive(clap::Args, Clone)]
pub struct Db {
    /// `sqlite://FILE` (created if missing) or `postgres://…`.
    #[arg(long, env = "AQGATE_DATABASE_URL", default_value = "sqlite://aqgate.db")]
    pub database: String,
}

/// `aqgate admin`'s subcommands.
#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// Make the database's topology equal to FILE; prints what changed.
    Apply {
        file: PathBuf,
        #[command(flatten)]
        db: Db,
        /// Print what would change, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// List queues with their depth (committed messages).
    Queues {
        #[command(flatten)]
        db: Db,
    },
    /// A queue's messages as Oracle's AQ$<QUEUE_TABLE> view shows them: id, state, priority,
    /// enqueue time and agent, sender, retries, consumer, correlation.
    Messages {
        /// The queue (`SCHEMA.NAME`).
        queue: String,
        #[command(flatten)]
        db: Db,
        /// Only messages in this state: READY, WAIT, PROCESSED, EXPIRED or UNDELIVERABLE.
        #[arg(long)]
        state: Option<String>,
        /// Show at most N rows (the first in enqueue order; 1 to 100000). When there are
        /// more, a last line says so (on standard error with --json).
        #[arg(long, value_name = "N", default_value_t = crate::messages::DEFAULT_LIMIT)]
        limit: i64,
        /// Print every column of every row as a JSON array.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        filters: MessageFilters,
    },
    /// List agents: protocols, database users, gateway flag, certificate location.
    Agents {
        #[command(flatten)]
        db: Db,
    },
    /// Mail the SMTP filter accepted and has not finished: to forward, replies owed, or
    /// failed for good.
    Spool {
        #[command(flatten)]
        db: Db,
    },
    /// Notifications not yet delivered (pending retries and parked ones), or put parked
    /// ones back in line.
    Notifications {
        #[command(flatten)]
        db: Db,
        /// Put every parked notification back in line (due now, attempts reset).
        #[arg(long)]
        retry_parked: bool,
    },
    /// Propagation jobs with their state, owner, counts, backlog, lag and last error; or
    /// enable or disable one (running servers follow by themselves), remove one, or reset one.
    Jobs {
        #[command(flatten)]
        db: Db,
        /// Print the jobs as a JSON array.
        #[arg(long, conflicts_with_all = ["enable", "disable"])]
        json: bool,
        /// Enable the job in the stored topology: a running node starts it (ENABLE_JOB).
        #[arg(long, value_name = "JOB", conflicts_with = "disable")]
        enable: Option<String>,
        /// Disable the job in the stored topology: its holder stops it after the batch in
        /// flight (DISABLE_JOB); REQUESTED reads DISABLED at once, ACTUAL once it stopped.
        #[arg(long, value_name = "JOB", conflicts_with = "remove")]
        disable: Option<String>,
        /// Take the job out of the stored topology (REMOVE_JOB): a running node stops it;
        /// DELETE_PENDING until a node has ended its state at the broker.
        #[arg(long, value_name = "JOB", conflicts_with_all = ["json", "enable", "reset"])]
        remove: Option<String>,
        /// With --remove: also delete its status, doubts and marks now, leaving what it
        /// keeps at the broker there (FORCE).
        #[arg(long, requires = "remove")]
        force: bool,
        /// RESET_JOB: a FAILED or RETRYING job tries again now (failure count 0, back-off
        /// ended); its holder restarts it at its next heartbeat.
        #[arg(long, value_name = "JOB", conflicts_with_all = ["json", "enable", "disable"])]
        reset: Option<String>,
    },
    /// The Messaging Gateway's agents (every process running propagation jobs: NOT_STARTED,
    /// STARTING, RUNNING, SHUTTING_DOWN, BROKEN, instance, last error) and links, with
    /// each process's view of each (CONNECTED, RECONNECTING, DISCONNECTED, STALE, since
    /// when, last error); or ping the running agents.
    Gateway {
        #[command(flatten)]
        db: Db,
        /// Print the links (with --agents: the agents; with --foreign-queues: the foreign
        /// queues) as a JSON array.
        #[arg(long)]
        json: bool,
        /// The agents only.
        #[arg(long)]
        agents: bool,
        /// The foreign queues (MGW_FOREIGN_QUEUES): link, the broker's name, domain,
        /// direction, options and the jobs that use each.
        #[arg(long, conflicts_with_all = ["agents", "ping"])]
        foreign_queues: bool,
        /// AGENT_PING: ask the running agents to answer; REACHABLE and each one that did,
        /// or UNREACHABLE and a non-zero exit when none did within --timeout-ms.
        #[arg(long, conflicts_with_all = ["json", "agents"])]
        ping: bool,
        /// How long --ping waits for an answer.
        #[arg(long, value_name = "MS", default_value_t = 5000, requires = "ping",
              value_parser = clap::value_parser!(u64).range(1..=600_000))]
        timeout_ms: u64,
    },
    /// List registrations, or set the HMAC secret of one (read from standard input, or
    /// AQGATE_NOTIFY_SECRET; an empty secret removes it).
    Registrations {
        #[command(flatten)]
        db: Db,
        /// Set the secret of the registration QUEUE CONSUMER AGENT (CONSUMER `-` on a
        /// single-consumer queue).
        #[arg(long, num_args = 3, value_names = ["QUEUE", "CONSUMER", "AGENT"])]
        set_secret: Option<Vec<String>>,
    },
    /// Print an argon2 hash of the password read from standard input (for `password_hash`).
    HashPassword,
    /// Move messages of an exception queue back to the queue each left, as new messages
    /// linked to theirs (ORIGINAL_MSGID), with no failed dequeues, delay or expiration; a
    /// batch per transaction, each with its audit row. Progress on standard error.
    Replay {
        /// The exception queue (`SCHEMA.NAME`).
        queue: String,
        #[command(flatten)]
        db: Db,
        /// Only this message (32 hex digits); repeat for several.
        #[arg(long = "msgid", value_name = "ID")]
        msgids: Vec<String>,
        /// Only messages with this correlation.
        #[arg(long, value_name = "C")]
        correlation: Option<String>,
        /// Only messages moved for this reason: TIME_EXPIRATION, MAX_RETRY_EXCEEDED,
        /// PROPAGATION_FAILURE or INVALID_TRANSFORMATION.
        #[arg(long)]
        reason: Option<String>,
        /// Move at most N messages (1 to 10000).
        #[arg(long, value_name = "N", default_value_t = crate::replay::DEFAULT_MAX)]
        max: i64,
        /// Messages per transaction (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = crate::replay::DEFAULT_BATCH)]
        batch: i64,
        /// List and count what would move; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Who replays (an agent's or operator's name), recorded in the audit log.
        #[arg(long = "as", value_name = "NAME")]
        actor: String,
    },
    /// The audit log: what operators did through `admin` (replays), newest first.
    Audit {
        #[command(flatten)]
        db: Db,
        /// Show at most N rows.
        #[arg(long, value_name = "N", default_value_t = 1000)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// What the store knows of one message: enqueue, delay, expiration, dequeues, the move
    /// to an exception queue, copies and replays, the gateway's doubt, audit rows.
    Timeline {
        /// The message id (32 hex digits).
        msgid: String,
        #[command(flatten)]
        db: Db,
        #[arg(long)]
        json: bool,
    },
    /// Which of a queue's first messages a selector condition or subscriber rule matches,
    /// and why: the messages browsed (nothing locked, counted or written), the condition
    /// evaluated by the dequeue's own evaluator within the server's default budgets.
    TestCondition {
        /// The queue (`SCHEMA.NAME`).
        queue: String,
        /// The condition, as a dequeue's selector or a subscriber's rule takes it (e.g.
        /// `priority < 3 AND corrid LIKE 'ORD%'`).
        condition: String,
        #[command(flatten)]
        db: Db,
        /// Browse as this consumer (a multi-consumer queue's; its first subscriber when not
        /// given).
        #[arg(long)]
        consumer: Option<String>,
        /// Test the first N messages in dequeue order (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = crate::tester::DEFAULT_TESTED)]
        limit: i64,
        /// Print the verdicts as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The open IDAP sessions (of every process sharing the database): id hash prefix,
    /// agent, idle time, locked and enqueued messages; or end one, rolling its transaction
    /// back.
    Sessions {
        #[command(flatten)]
        db: Db,
        #[arg(long)]
        json: bool,
        /// End the session whose ID starts with these hex digits, its transaction rolled back.
        #[arg(long, value_name = "ID")]
        abort: Option<String>,
    },
}

/// `admin messages`' filters and cursor (the console's listing takes the same).
#[derive(clap::Args, Debug, Clone)]
pub struct MessageFilters {
    /// Go on after this cursor (the one the last page printed): whole messages a page.
    #[arg(long, value_name = "CURSOR")]
    pub after: Option<String>,
    /// Only messages with this correlation (with --corr-prefix: starting with it).
    #[arg(long)]
    pub corr: Option<String>,
    /// --corr is a prefix: the messages whose correlation starts with it.
    #[arg(long)]
    pub corr_prefix: bool,
    /// Only messages of this sender agent (SENDER_NAME or ENQ_USER_ID, any case).
    #[arg(long)]
    pub sender: Option<String>,
    /// Only messages of at least this priority.
    #[arg(long)]
    pub min_priority: Option<i64>,
    /// Only messages of at most this priority.
    #[arg(long)]
    pub max_priority: Option<i64>,
    /// Only messages whose payload's first 64 KiB hold this text (at most 5,000 messages
    /// looked at a page).
    #[arg(long, value_name = "TEXT")]
    pub payload_contains: Option<String>,
}

impl MessageFilters {
    /// The store's filter, in `state` too.
    pub fn to_filter(self, state: Option<String>) -> aqgate_core::store::ViewFilter {
        aqgate_core::store::ViewFilter {
            state,
            min_priority: self.min_priority,
            max_priority: self.max_priority,
            correlation: self.corr,
            corr_prefix: self.corr_prefix,
            sender: self.sender,
            payload: self.payload_contains.map(String::into_bytes),
            ..Default::default()
        }
    }
}

/// Runs an `aqgate admin` command, its output on standard output.
pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    let out = &mut std::io::stdout();
    let open = |db: Db| async move { aqgate_store::open(&db.database).await };
    match command {
        AdminCommand::Apply { file, db, dry_run } => {
            let text = std::fs::read_to_string(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let topo =
                Topology::from_toml(&text).map_err(|e| anyhow::anyhow!("{}: {}", file.display(), e.join("; ")))?;
            crate::print_apply(open(db).await?.as_ref(), &topo, dry_run, out).await
        }
        AdminCommand::Queues { db } => crate::topology::print_queues(open(db).await?.as_ref(), out).await,
        AdminCommand::Messages { queue, db, state, limit, json, filters } => {
            let store = open(db).await?;
            let note = &mut std::io::stderr();
            let after = filters.after.clone();
            let filter = filters.to_filter(state);
            crate::messages::print_messages(store.as_ref(), &queue, &filter, after.as_deref(), limit, json, out, note)
                .await
        }
        AdminCommand::Agents { db } => crate::topology::print_agents(open(db).await?.as_ref(), out).await,
        AdminCommand::Spool { db } => crate::spool::print_spool(open(db).await?.as_ref(), out).await,
        AdminCommand::Jobs { db, remove: Some(name), force, .. } => {
            let r = crate::jobs::remove(open(db).await?.as_ref(), &name, force).await?;
            let mut say = String::new();
            if r.defined {
                say.push_str(&format!(
                    "job {name} removed from the stored topology; running nodes stop it within a second, after \
                     its batch in flight; `serve --topology` will not re-create it, `admin apply FILE` would\n"
                ));
            }
            if r.pending {
                say.push_str(&format!(
                    "job {name} is DELETE_PENDING until a running node (now, or the next to start) has ended \
                     its state at the broker\n"
                ));
            }
            if force {
                say.push_str(&format!(
                    "job {name}: status {}, {} doubt and mark rows deleted\n",
                    if r.status { "deleted" } else { "absent" },
                    r.rows
                ));
                if let Some(left) = r.left {
                    say.push_str(&format!("left at the broker (remove it there): {left}\n"));
                }
            }
            std::io::Write::write_all(out, say.as_bytes())?;
            Ok(())
        }
        AdminCommand::Jobs { db, reset: Some(name), .. } => {
            let had = crate::jobs::reset(open(db).await?.as_ref(), &name).await?;
            let say = if had {
                format!(
                    "job {name} reset: failure count 0, lease ended; the node running it restarts it at its next \
                     heartbeat, without back-off\n"
                )
            } else {
                format!("job {name} has not run yet: nothing to reset\n")
            };
            std::io::Write::write_all(out, say.as_bytes())?;
            Ok(())
        }
        AdminCommand::Jobs { db, json, enable, disable, remove: None, reset: None, force: _ } => {
            let store = open(db).await?;
            let on = enable.is_some();
            match enable.or(disable) {
                None => crate::jobs::print_jobs(store.as_ref(), json, out).await,
                Some(name) => {
                    anyhow::ensure!(
                        crate::jobs::set_enabled(store.as_ref(), &name, on).await?,
                        "no propagation job {name} in the stored topology"
                    );
                    std::io::Write::write_fmt(
                        out,
                        format_args!(
                            "job {name} {}; running servers follow within a second (`admin jobs` shows \
                             REQUESTED and ACTUAL)\n",
                            if on { "enabled" } else { "disabled" }
                        ),
                    )?;
                    Ok(())
                }
            }
        }
        AdminCommand::Gateway { db, json, agents, foreign_queues, ping, timeout_ms } => {
            let store = open(db).await?;
            if foreign_queues {
                crate::gateway::print_foreign_queues(store.as_ref(), json, out).await
            } else if ping {
                crate::gateway::print_ping(store.as_ref(), std::time::Duration::from_millis(timeout_ms), out).await
            } else if agents {
                crate::gateway::print_agents(store.as_ref(), json, out).await
            } else {
                crate::gateway::print_gateway(store.as_ref(), json, out).await
            }
        }
        AdminCommand::Notifications { db, retry_parked } => {
            let store = open(db).await?;
            if retry_parked {
                crate::notifications::retry_parked(store.as_ref(), out).await
            } else {
                crate::notifications::print_notifications(store.as_ref(), out).await
            }
        }
        AdminCommand::Registrations { db, set_secret } => {
            let store = open(db).await?;
            match set_secret.as_deref() {
                None => crate::notifications::print_registrations(store.as_ref(), out).await,
                Some([queue, consumer, agent]) => {
                    let registration = [queue.as_str(), consumer.as_str(), agent.as_str()];
                    crate::notifications::set_secret(store.as_ref(), registration, &mut std::io::stdin().lock(), out)
                        .await
                }
                Some(_) => anyhow::bail!("--set-secret takes QUEUE CONSUMER AGENT"),
            }
        }
        AdminCommand::HashPassword => crate::print_password_hash(&mut std::io::stdin().lock(), out),
        AdminCommand::Replay { queue, db, msgids, correlation, reason, max, batch, dry_run, json, actor } => {
            let store = open(db).await?;
            let filter = crate::replay::ReplayFilter { msgids, correlation, reason };
            let req = crate::replay::ReplayRequest { queue, filter, max, batch, dry_run, actor };
            let mut progress = |done: usize, of: usize| eprintln!("replayed {done} of {of}");
            let report = crate::replay::replay(store.as_ref(), &req, &mut progress).await?;
            crate::replay::print_replay(&report, json, out)
        }
        AdminCommand::Audit { db, limit, json } => {
            crate::replay::print_audit(open(db).await?.as_ref(), limit, json, out).await
        }
        AdminCommand::Timeline { msgid, db, json } => {
            crate::timeline::print_timeline(open(db).await?.as_ref(), &msgid, json, out).await
        }
        AdminCommand::TestCondition { queue, condition, db, consumer, limit, json } => {
            let test = crate::tester::Test::with_default_budgets(&queue, &condition, consumer.as_deref(), limit);
            crate::tester::print_test(open(db).await?.as_ref(), &test, json, out).await
        }
        AdminCommand::Sessions { db, json, abort } => {
            let store = open(db).await?;
            match abort {
                Some(id) => crate::sessions::print_abort(store.as_ref(), &id, json, out).await,
                None => crate::sessions::print_sessions(store.as_ref(), json, out).await,
            }
        }
    }
}
