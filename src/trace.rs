//! `--trace FILE`: where a link's time went, as Chrome trace-event JSON (opens in Perfetto and
//! `chrome://tracing`).
//!
//! Process 1, "dtlto-reapi", has two tracks for what precedes the jobs, "connection" (connecting to
//! the cluster) and "link" (hashing every input), which run at the same time, and one track per
//! concurrent slot: a job takes the lowest free slot
//! when it starts and gives it back when it ends, so the tracks show how busy the link kept its
//! slots. On its slot a job is one span (named after its module) holding its phases in order:
//! planning, disk-cache and action-cache lookups, upload, remote execution, download, local compile,
//! fallback. Process 2, "cluster", shows what the cluster reported in each ExecutedActionMetadata
//! (queued, input fetch, executing, output upload) on the worker's own tracks, one lane per action
//! running at the same time on that worker.
//!
//! With `--strategy=racing` the local compile and the cluster's phases of a job overlap on its
//! track, inside a "race" span whose arguments name the winner and how long each side ran.
//!
//! The executor marks a phase with one line, `let _phase = trace::phase("upload");`: the job being
//! traced is a task-local of the job's task (set by [`Scope::run`]), so no handle is threaded through the
//! executor, and without `--trace` a phase costs one task-local lookup.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use serde::Serialize;
use serde_json::{Value, json};

use crate::jobs::Job;
use crate::stats::{ServerTimes, micros_between};

/// The process ids of the two groups of tracks.
const CLIENT_PID: u32 = 1;
const CLUSTER_PID: u32 = 2;

/// A link's trace, filled in by its jobs and written at the end.
pub struct Trace {
    started: Instant,
    /// `started` on the wall clock, to place the cluster's timestamps.
    started_wall: SystemTime,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Completed spans on the slot tracks.
    spans: Vec<Event>,
    /// Which slots are taken.
    slots: Vec<bool>,
    /// The cluster's executions, per worker: (start, end, spans inside), in microseconds.
    executions: BTreeMap<String, Vec<Execution>>,
}

/// One complete ("X") event.
#[derive(Debug, Clone, Serialize)]
struct Event {
    name: String,
    cat: &'static str,
    ph: &'static str,
    /// Microseconds since the trace started.
    ts: i64,
    dur: i64,
    pid: u32,
    tid: usize,
    #[serde(skip_serializing_if = "Value::is_null")]
    args: Value,
}

struct Execution {
    start: i64,
    end: i64,
    events: Vec<Event>,
}

/// The tracks of the link-level phases; slot `n` is track `n + SLOT_TID_BASE`.
const LINK_TID: usize = 0;
const CONNECTION_TID: usize = 1;
const SLOT_TID_BASE: usize = 2;

/// Where a link-level phase goes: connecting to the cluster runs beside the rest.
#[derive(Clone, Copy)]
pub enum LinkTrack {
    /// Connecting to the cluster.
    Connection,
    /// Hashing the inputs.
    Link,
}

/// The job a task is running (or the link itself), for [`phase`].
#[derive(Clone)]
pub struct JobTrack {
    trace: Arc<Trace>,
    tid: usize,
    module: String,
}

tokio::task_local! {
    static CURRENT: Option<JobTrack>;
}

impl Trace {
    pub fn new() -> Arc<Trace> {
        Arc::new(Trace {
            started: Instant::now(),
            started_wall: SystemTime::now(),
            state: Mutex::new(State::default()),
        })
    }

    fn micros(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.started).as_micros()).unwrap_or(i64::MAX)
    }

    /// Where a server's time (microseconds since the Unix epoch) falls on the trace's clock.
    fn micros_of_server_time(&self, micros: Option<i64>) -> Option<i64> {
        let started = self
            .started_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()?;
        micros?.checked_sub(i64::try_from(started.as_micros()).ok()?)
    }

    fn record(&self, event: Event) {
        if let Ok(mut state) = self.state.lock() {
            state.spans.push(event);
        }
    }

    /// Writes the trace as `{"traceEvents": [...]}`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let state = self
            .state
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        let mut events: Vec<Value> = vec![metadata("process_name", CLIENT_PID, 0, "dtlto-reapi")];
        if !state.executions.is_empty() {
            events.push(metadata("process_name", CLUSTER_PID, 0, "cluster"));
        }
        events.push(metadata("thread_name", CLIENT_PID, LINK_TID, "link"));
        events.push(metadata(
            "thread_name",
            CLIENT_PID,
            CONNECTION_TID,
            "connection",
        ));
        for slot in 0..state.slots.len() {
            events.push(metadata(
                "thread_name",
                CLIENT_PID,
                slot + SLOT_TID_BASE,
                &format!("slot {slot}"),
            ));
        }
        for event in &state.spans {
            events.push(serde_json::to_value(event).map_err(std::io::Error::other)?);
        }
        // Each worker's executions in lanes, so that the spans of one track never overlap.
        let mut tid = 0;
        for (worker, executions) in &state.executions {
            let mut order: Vec<&Execution> = executions.iter().collect();
            order.sort_by_key(|e| e.start);
            let mut lane_ends: Vec<i64> = Vec::new();
            let first_tid = tid;
            for execution in order {
                let lane = match lane_ends.iter().position(|&end| end <= execution.start) {
                    Some(lane) => lane,
                    None => {
                        lane_ends.push(0);
                        lane_ends.len() - 1
                    }
                };
                lane_ends[lane] = execution.end;
                for event in &execution.events {
                    let mut event = event.clone();
                    event.tid = first_tid + lane;
                    events.push(serde_json::to_value(event).map_err(std::io::Error::other)?);
                }
            }
            for lane in 0..lane_ends.len() {
                let name = format!("{worker} #{lane}");
                events.push(metadata(
                    "thread_name",
                    CLUSTER_PID,
                    first_tid + lane,
                    &name,
                ));
            }
            tid += lane_ends.len();
        }
        let mut json =
            serde_json::to_vec(&json!({ "traceEvents": events, "displayTimeUnit": "ms" }))
                .map_err(std::io::Error::other)?;
        json.push(b'\n');
        crate::staging::write_atomically(path, &json)
    }
}

fn metadata(name: &str, pid: u32, tid: usize, value: &str) -> Value {
    json!({ "name": name, "ph": "M", "pid": pid, "tid": tid, "args": { "name": value } })
}

/// A job about to run, traced on a free slot of the trace (when tracing).
pub struct Scope {
    trace: Option<Arc<Trace>>,
    module: String,
    index: usize,
}

impl Scope {
    pub fn of(trace: Option<&Arc<Trace>>, job: &Job) -> Scope {
        Scope {
            trace: trace.cloned(),
            module: job.module().to_string_lossy().into_owned(),
            index: job.index,
        }
    }

    /// Runs the job's future: when tracing, its whole run is one span on the lowest free slot,
    /// and its phases are spans inside it.
    pub async fn run<F: Future>(self, future: F) -> F::Output {
        let Some(trace) = self.trace else {
            return CURRENT.scope(None, future).await;
        };
        let slot = match trace.state.lock() {
            Ok(mut state) => match state.slots.iter().position(|taken| !taken) {
                Some(free) => {
                    state.slots[free] = true;
                    free
                }
                None => {
                    state.slots.push(true);
                    state.slots.len() - 1
                }
            },
            Err(_) => 0,
        };
        let track = JobTrack {
            trace: trace.clone(),
            tid: slot + SLOT_TID_BASE,
            module: self.module,
        };
        let args = json!({ "index": self.index });
        let whole = Phase::start(&track, track.module.clone(), "job", args);
        let output = CURRENT.scope(Some(track), future).await;
        drop(whole);
        if let Ok(mut state) = trace.state.lock()
            && let Some(taken) = state.slots.get_mut(slot)
        {
            *taken = false;
        }
        output
    }
}

/// A phase of the current job, recorded when dropped; nothing when the job is not traced.
pub fn phase(name: &'static str) -> Option<Phase> {
    CURRENT
        .try_with(|track| {
            let track = track.as_ref()?;
            Some(Phase::start(track, name.to_owned(), "phase", Value::Null))
        })
        .ok()
        .flatten()
}

/// A phase of the current job that began at `since` and ends now, with `args` saying how it went
/// (a race: who won, how long each side ran); nothing when the job is not traced.
pub fn phase_since(name: &'static str, since: Instant, args: Value) {
    let _ = CURRENT.try_with(|track| {
        if let Some(track) = track {
            let mut phase = Phase::start(track, name.to_owned(), "phase", args);
            phase.started = since;
        }
    });
}

/// A phase of the link itself (before its jobs run), on one of the link's tracks; nothing without a
/// trace.
pub fn link_phase(trace: Option<&Arc<Trace>>, on: LinkTrack, name: &'static str) -> Option<Phase> {
    let track = JobTrack {
        trace: trace?.clone(),
        tid: match on {
            LinkTrack::Connection => CONNECTION_TID,
            LinkTrack::Link => LINK_TID,
        },
        module: String::new(),
    };
    Some(Phase::start(&track, name.to_owned(), "link", Value::Null))
}

/// What the cluster reported about the current job's execution, placed on the worker's track.
pub fn remote_execution(times: &ServerTimes) {
    let _ = CURRENT.try_with(|track| {
        let Some(track) = track else { return };
        let trace = &track.trace;
        let at = |micros: Option<i64>| trace.micros_of_server_time(micros);
        let span = |name: &str, from: Option<i64>, to: Option<i64>| {
            Some(Event {
                name: name.to_owned(),
                cat: "cluster",
                ph: "X",
                ts: from?,
                dur: micros_between(from, to)?,
                pid: CLUSTER_PID,
                tid: 0,
                args: Value::Null,
            })
        };
        let (queued, started, completed) = (
            at(times.queued),
            at(times.worker_start),
            at(times.worker_completed),
        );
        let Some(mut whole) = span(&track.module, queued.or(started), completed) else {
            return;
        };
        whole.cat = "action";
        whole.args = json!({ "worker": times.worker });
        // `ts + dur` is the `to` it was computed from: it cannot overflow.
        let end = whole.ts + whole.dur;
        let mut events = vec![whole.clone()];
        let inner = [
            ("queued", queued, started),
            (
                "input fetch",
                at(times.input_fetch.0),
                at(times.input_fetch.1),
            ),
            ("executing", at(times.execution.0), at(times.execution.1)),
            (
                "output upload",
                at(times.output_upload.0),
                at(times.output_upload.1),
            ),
        ];
        // Only spans inside the whole one: a server's odd timestamps must not break the nesting.
        events.extend(
            inner
                .into_iter()
                .filter_map(|(name, from, to)| span(name, from, to))
                .filter(|e| e.ts >= whole.ts && e.ts + e.dur <= end),
        );
        if let Ok(mut state) = trace.state.lock() {
            state
                .executions
                .entry(times.worker.clone())
                .or_default()
                .push(Execution {
                    start: whole.ts,
                    end,
                    events,
                });
        }
    });
}

/// An open span on a job's slot track.
pub struct Phase {
    track: JobTrack,
    name: String,
    cat: &'static str,
    args: Value,
    started: Instant,
}

impl Phase {
    fn start(track: &JobTrack, name: String, cat: &'static str, args: Value) -> Phase {
        Phase {
            track: track.clone(),
            name,
            cat,
            args,
            started: Instant::now(),
        }
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        let trace = &self.track.trace;
        let (start, end) = (trace.micros(self.started), trace.micros(Instant::now()));
        trace.record(Event {
            name: std::mem::take(&mut self.name),
            cat: self.cat,
            ph: "X",
            ts: start,
            dur: end - start,
            pid: CLIENT_PID,
            tid: self.track.tid,
            args: std::mem::take(&mut self.args),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn job(index: usize, module: &str) -> Job {
        Job {
            index,
            args: vec![module.to_owned()].into(),
            inputs: vec![module.into(), "x.thinlto.bc".into()].into(),
            outputs: vec!["x.o".into()].into(),
        }
    }

    #[tokio::test]
    async fn jobs_take_the_lowest_free_slot_and_phases_nest_in_them() {
        let trace = Trace::new();
        let (a, b) = (job(0, "a.o"), job(1, "b.o"));
        let (t1, t2) = (trace.clone(), trace.clone());
        let first = tokio::spawn(async move {
            Scope::of(Some(&t1), &a)
                .run(async {
                    let _plan = phase("plan");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                })
                .await
        });
        let second = tokio::spawn(async move {
            Scope::of(Some(&t2), &b)
                .run(async {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                })
                .await
        });
        first.await.unwrap();
        second.await.unwrap();
        // Untraced: no phase at all.
        assert!(phase("plan").is_none());

        let state = trace.state.lock().unwrap();
        assert_eq!(state.slots, [false, false]);
        let by_name = |name: &str| state.spans.iter().find(|e| e.name == name).unwrap().clone();
        let (a, b, plan) = (by_name("a.o"), by_name("b.o"), by_name("plan"));
        assert_ne!(a.tid, b.tid, "concurrent jobs share a slot");
        assert_eq!(plan.tid, a.tid);
        assert!(plan.ts >= a.ts && plan.ts + plan.dur <= a.ts + a.dur);
        assert!(plan.dur >= 20_000, "{plan:?}");
    }
}
