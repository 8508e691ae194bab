//! Propagation loops: local jobs whose sources and destinations form a cycle would move
//! every message that enters it forever (each move is a new message, so no retry count or
//! expiry of the original stops it). The topology refuses them.
//!
//! Only jobs within this store are edges: a loop through another aqgate cannot be seen
//! here, and a forwarder's reply queue is fed by an HTTP service, not by the job.

use std::collections::BTreeMap;

use super::propagation::PropagationInfo;

/// One error per cycle of local jobs, naming the jobs and the queues in order.
pub fn errors(jobs: &BTreeMap<String, PropagationInfo>) -> Vec<String> {
    // Queue → the local jobs leaving it (name, destination), in name order.
    let mut out: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for j in jobs.values().filter(|j| j.remote.is_none() && j.forward.is_none()) {
        out.entry(j.source.as_str()).or_default().push((j.name.as_str(), j.destination.as_str()));
    }
    let mut errors = Vec::new();
    // Every queue whose cycles have all been reported: a cycle is reported from its
    // smallest queue, once.
    let mut done: Vec<&str> = Vec::new();
    for &start in out.keys() {
        // Depth-first over paths from `start` that stay above it (in queue order).
        let mut stack: Vec<(&str, Vec<(&str, &str)>)> = vec![(start, Vec::new())];
        while let Some((at, path)) = stack.pop() {
            for &(job, next) in out.get(at).map(Vec::as_slice).unwrap_or_default() {
                let mut p = path.clone();
                p.push((job, next));
                if next == start {
                    let queues: Vec<&str> = std::iter::once(start).chain(p.iter().map(|(_, q)| *q)).collect();
                    let names: Vec<&str> = p.iter().map(|(j, _)| *j).collect();
                    errors.push(format!(
                        "propagations ({}): the jobs form a loop {}: a message would move around it forever",
                        names.join(", "),
                        queues.join(" → ")
                    ));
                } else if next > start && !done.contains(&next) && !path.iter().any(|(_, q)| *q == next) {
                    stack.push((next, p));
                }
            }
        }
        done.push(start);
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, source: &str, destination: &str) -> (String, PropagationInfo) {
        let info = PropagationInfo {
            name: name.into(),
            source: source.into(),
            destination: destination.into(),
            agent: format!("PROP${name}"),
            consumer: None,
            condition: None,
            batch_size: 30,
            preserve_message_id: false,
            exception_queue: None,
            enabled: true,
            remote: None,
            forward: None,
            concurrency: 1,
            retry_backoff_ms: 1000,
            space: None,
            schedule: Default::default(),
            transformation: None,
            gateway: None,
        };
        (name.into(), info)
    }

    #[test]
    fn cycles_of_local_jobs_are_found_once_each() {
        let jobs: BTreeMap<_, _> =
            [job("AB", "A", "B"), job("BC", "B", "C"), job("CA", "C", "A"), job("CD", "C", "D"), job("DD", "D", "D")]
                .into_iter()
                .collect();
        let e = errors(&jobs);
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("(AB, BC, CA)") && e[0].contains("A → B → C → A"), "{e:?}");
        assert!(e[1].contains("(DD)") && e[1].contains("D → D"), "{e:?}");
    }

    #[test]
    fn chains_and_fan_outs_are_no_loops() {
        let jobs: BTreeMap<_, _> =
            [job("AB", "A", "B"), job("AC", "A", "C"), job("BD", "B", "D"), job("CD", "C", "D")].into_iter().collect();
        assert_eq!(errors(&jobs), Vec::<String>::new());
    }

    #[test]
    fn a_loop_through_a_remote_is_not_seen_here() {
        let mut jobs: BTreeMap<_, _> = [job("AB", "A", "B"), job("BA", "B", "A")].into_iter().collect();
        assert_eq!(errors(&jobs).len(), 1);
        jobs.get_mut("BA").expect("job").remote = Some(super::super::propagation::RemoteDef {
            url: "http://127.0.0.1:1/aqserv".into(),
            agent: "scott".into(),
            password_env: None,
            password_file: None,
            ca_file: None,
        });
        assert_eq!(errors(&jobs), Vec::<String>::new());
    }
}
