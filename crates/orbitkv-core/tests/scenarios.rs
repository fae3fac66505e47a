//! Scenario tests: `testdata/*.txt` are scripts of `CacheState` operations
//! with the expected result of each, run line by line. Invariants are
//! checked after every line. A mismatch names `file:line`, expected and got.
//!
//! Language (one command per line; `#` starts a comment; names are free words):
//!
//! ```text
//! cache slots=N                  a fresh cache of N 4 KiB slots (first line)
//! ssd [min_hits=N]               spill every block that qualifies (eager)
//! register NS block=B [fp=F] [shard=N]   -> gen G
//! generation NS                  -> gen G
//! open S                         a new session named S
//! save S NS h...                 begin + commit -> committed N
//! begin S SAVE NS h...           -> one word per block: allocated | present | refused
//! commit S SAVE                  -> committed N
//! abort S SAVE
//! lookup S LEASE NS h...         -> hit N   (names the lease when N > 0)
//! acquire S LEASE                -> ready N | stage N | wait | lost N
//! finish ok|fail...              report the last `acquire -> stage` reads, in order
//! spill                          spill everything that qualifies, successfully -> spilled N
//! spill start                    take the spill candidates -> spilling N
//! spill finish ok|fail           report them
//! release S LEASE
//! end S clean|vanished|gone
//! reset NS                       generation reset -> gen G
//! expect quarantined S | expect open S | expect ended S
//! expect visible NS h... | expect missing NS h...
//! expect gauge NAME N            a field of `Gauges` (or `counter NAME N` for `Counters`)
//! expect removals N              take the SSD copies to delete: how many
//! ```
//!
//! `CMD -> RESULT` checks the result; a command without `->` must succeed
//! (its result must not be an error). Errors read `error <CacheError variant>`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use orbitkv_core::{
    AcquireStep, BlockHash, CacheError, CacheState, Fingerprint, LeaseId, NamespaceKey, NsId, SaveId,
    SaveStatus, SessionEnd, SessionId, SpillJob, SpillPolicy, StageJob,
};

const SLOT: u64 = 4096;

fn word_bytes(w: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, b) in w.bytes().enumerate() {
        out[i % 32] ^= b.wrapping_add(i as u8 / 32);
    }
    out
}

fn error_word(e: &CacheError) -> String {
    let dbg = format!("{e:?}");
    let name: String = dbg.chars().take_while(|c| c.is_alphanumeric()).collect();
    format!("error {name}")
}

/// A namespace generation as a script result (`gen G`), or the error's word.
fn generation_word(r: Result<u64, CacheError>) -> String {
    r.map_or_else(|e| error_word(&e), |g| format!("gen {g}"))
}

/// Take every pending job (`what`: what they are) and pair it with its result
/// flag; an error, the jobs gone all the same, unless there is one flag a job.
fn take_with_results<J>(pending: &mut Vec<J>, fl: Vec<bool>, what: &str) -> Result<Vec<(J, bool)>, String> {
    let jobs = std::mem::take(pending);
    if fl.len() != jobs.len() {
        return Err(format!(
            "{} {what} pending, {} result(s) given",
            jobs.len(),
            fl.len()
        ));
    }
    Ok(jobs.into_iter().zip(fl).collect())
}

/// The id a script named `name` (`what`: the kind of thing, for the error).
fn named<T: Copy>(ids: &HashMap<String, T>, what: &str, name: &str) -> Result<T, String> {
    ids.get(name).copied().ok_or(format!("unknown {what} {name}"))
}

#[derive(Default)]
struct Run {
    cache: Option<CacheState>,
    sessions: HashMap<String, SessionId>,
    namespaces: HashMap<String, NsId>,
    leases: HashMap<String, LeaseId>,
    saves: HashMap<String, SaveId>,
    staging: Vec<StageJob>,
    spilling: Vec<SpillJob>,
}

type Step = Result<String, String>;

impl Run {
    fn cache(&mut self) -> Result<&mut CacheState, String> {
        self.cache
            .as_mut()
            .ok_or_else(|| "no `cache slots=N` line yet".to_string())
    }

    fn session(&self, name: &str) -> Result<SessionId, String> {
        named(&self.sessions, "session", name)
    }

    fn ns(&self, name: &str) -> Result<NsId, String> {
        named(&self.namespaces, "namespace", name)
    }

    fn lease(&self, name: &str) -> Result<LeaseId, String> {
        named(&self.leases, "lease", name)
    }

    fn save_id(&self, name: &str) -> Result<SaveId, String> {
        named(&self.saves, "save", name)
    }

    /// Run one command: `Ok(result)` to compare, `Err` for a malformed script.
    fn step(&mut self, words: &[&str]) -> Step {
        let hashes = |ws: &[&str]| ws.iter().map(|w| word_bytes(w)).collect::<Vec<BlockHash>>();
        let flags = |ws: &[&str]| -> Result<Vec<bool>, String> {
            ws.iter()
                .map(|w| match *w {
                    "ok" => Ok(true),
                    "fail" => Ok(false),
                    other => Err(format!("expected ok or fail, got {other}")),
                })
                .collect()
        };
        let ok_or = |r: Result<(), CacheError>| r.map_or_else(|e| error_word(&e), |()| "ok".into());
        match words {
            ["cache", size] => {
                let slots: u64 = size
                    .strip_prefix("slots=")
                    .and_then(|n| n.parse().ok())
                    .ok_or("cache slots=N")?;
                *self = Run {
                    cache: Some(CacheState::new(&[slots * SLOT])),
                    ..Run::default()
                };
                Ok("ok".into())
            }
            ["ssd", rest @ ..] => {
                let min_hits = match rest {
                    [] => 0,
                    [m] => m
                        .strip_prefix("min_hits=")
                        .and_then(|n| n.parse().ok())
                        .ok_or("ssd [min_hits=N]")?,
                    _ => return Err("ssd [min_hits=N]".into()),
                };
                self.cache()?.enable_ssd_with(min_hits, SpillPolicy::Eager);
                Ok("ok".into())
            }
            ["register", name, opts @ ..] => {
                let (mut block, mut fp, mut shard) = (None, *name, 0u32);
                for o in opts {
                    match o.split_once('=') {
                        Some(("block", v)) => block = v.parse::<u64>().ok(),
                        Some(("fp", v)) => fp = v,
                        Some(("shard", v)) => shard = v.parse().map_err(|_| format!("bad shard {v}"))?,
                        _ => return Err(format!("unknown option {o}")),
                    }
                }
                let key = NamespaceKey {
                    fingerprint: Fingerprint(word_bytes(fp)),
                    shard,
                    salt: [0; 32],
                };
                let block = block.ok_or("register NS block=B")?;
                Ok(match self.cache()?.register_namespace(key, block) {
                    Ok((id, g)) => {
                        self.namespaces.insert(name.to_string(), id);
                        format!("gen {g}")
                    }
                    Err(e) => error_word(&e),
                })
            }
            ["generation", ns] => {
                let ns = self.ns(ns)?;
                Ok(generation_word(self.cache()?.generation_of(ns)))
            }
            ["open", name] => {
                let s = self.cache()?.open_session();
                self.sessions.insert(name.to_string(), s);
                Ok("ok".into())
            }
            ["save", s, ns, hs @ ..] => {
                let (s, ns) = (self.session(s)?, self.ns(ns)?);
                let c = self.cache()?;
                let r = c
                    .begin_save(s, ns, &hashes(hs))
                    .and_then(|(id, _)| c.commit_save(s, id));
                Ok(r.map_or_else(|e| error_word(&e), |n| format!("committed {n}")))
            }
            ["begin", s, save, ns, hs @ ..] => {
                let (s, ns) = (self.session(s)?, self.ns(ns)?);
                match self.cache()?.begin_save(s, ns, &hashes(hs)) {
                    Ok((id, st)) => {
                        self.saves.insert(save.to_string(), id);
                        let words: Vec<&str> = st
                            .iter()
                            .map(|x| match x {
                                SaveStatus::Allocated(_) => "allocated",
                                SaveStatus::Present => "present",
                                SaveStatus::Refused => "refused",
                            })
                            .collect();
                        Ok(words.join(" "))
                    }
                    Err(e) => Ok(error_word(&e)),
                }
            }
            ["commit", s, save] => {
                let (s, id) = (self.session(s)?, self.save_id(save)?);
                Ok(self
                    .cache()?
                    .commit_save(s, id)
                    .map_or_else(|e| error_word(&e), |n| format!("committed {n}")))
            }
            ["abort", s, save] => {
                let (s, id) = (self.session(s)?, self.save_id(save)?);
                Ok(ok_or(self.cache()?.abort_save(s, id)))
            }
            ["lookup", s, lease, ns, hs @ ..] => {
                let (s, ns) = (self.session(s)?, self.ns(ns)?);
                match self.cache()?.lookup(s, ns, &hashes(hs)) {
                    Ok(r) => {
                        if let Some(l) = r.lease {
                            self.leases.insert(lease.to_string(), l);
                        }
                        Ok(format!("hit {}", r.hit_blocks))
                    }
                    Err(e) => Ok(error_word(&e)),
                }
            }
            ["acquire", s, lease] => {
                let (s, l) = (self.session(s)?, self.lease(lease)?);
                Ok(match self.cache()?.acquire(s, l) {
                    Ok(AcquireStep::Ready(slots)) => format!("ready {}", slots.len()),
                    Ok(AcquireStep::Stage(jobs)) => {
                        let n = jobs.len();
                        self.staging = jobs;
                        format!("stage {n}")
                    }
                    Ok(AcquireStep::Wait) => "wait".into(),
                    Ok(AcquireStep::Lost { blocks }) => format!("lost {blocks}"),
                    Err(e) => error_word(&e),
                })
            }
            ["finish", fl @ ..] => {
                let jobs = take_with_results(&mut self.staging, flags(fl)?, "staging job(s)")?;
                let c = self.cache()?;
                for (j, ok) in jobs {
                    c.finish_stage(&j, ok);
                }
                Ok("ok".into())
            }
            ["spill"] => {
                let c = self.cache()?;
                let jobs = c.spill_candidates(usize::MAX);
                for j in &jobs {
                    c.spill_done(j, true);
                }
                Ok(format!("spilled {}", jobs.len()))
            }
            ["spill", "start"] => {
                self.spilling = self.cache()?.spill_candidates(usize::MAX);
                Ok(format!("spilling {}", self.spilling.len()))
            }
            ["spill", "finish", fl @ ..] => {
                let jobs = take_with_results(&mut self.spilling, flags(fl)?, "spill(s)")?;
                let c = self.cache()?;
                for (j, ok) in jobs {
                    c.spill_done(&j, ok);
                }
                Ok("ok".into())
            }
            ["release", s, lease] => {
                let (s, l) = (self.session(s)?, self.lease(lease)?);
                Ok(ok_or(self.cache()?.release(s, l)))
            }
            ["end", s, how] => {
                let how = match *how {
                    "clean" => SessionEnd::Clean,
                    "vanished" => SessionEnd::Vanished,
                    "gone" => SessionEnd::ProcessGone,
                    other => return Err(format!("end S clean|vanished|gone, not {other}")),
                };
                let s = self.session(s)?;
                Ok(ok_or(self.cache()?.end_session(s, how)))
            }
            ["reset", ns] => {
                let ns = self.ns(ns)?;
                Ok(generation_word(self.cache()?.bump_generation(ns)))
            }
            ["expect", what, s] if ["quarantined", "open", "ended"].contains(what) => {
                let s = self.session(s)?;
                let c = self.cache()?;
                let state = if c.is_quarantined(s) {
                    "quarantined"
                } else if c
                    // A lookup in no namespace has no effect; it only names the session's state.
                    .lookup(s, NsId(u32::MAX), &[])
                    .is_err_and(|e| e == CacheError::UnknownSession(s))
                {
                    "ended"
                } else {
                    "open"
                };
                Ok(if state == *what {
                    "ok".into()
                } else {
                    format!("session is {state}")
                })
            }
            ["expect", what @ ("visible" | "missing"), ns, hs @ ..] => {
                let ns = self.ns(ns)?;
                let c = self.cache()?;
                let wrong: Vec<&str> = hs
                    .iter()
                    .filter(|h| c.is_visible(ns, &word_bytes(h)) != (*what == "visible"))
                    .copied()
                    .collect();
                Ok(if wrong.is_empty() {
                    "ok".into()
                } else {
                    format!("not {what}: {}", wrong.join(" "))
                })
            }
            ["expect", kind @ ("gauge" | "counter"), name, n] => {
                let c = self.cache()?;
                let dbg = if *kind == "gauge" {
                    format!("{:?}", c.gauges())
                } else {
                    format!("{:?}", c.counters())
                };
                let value = dbg
                    .split([',', '{', '}'])
                    .filter_map(|f| f.trim().split_once(": "))
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.trim().to_string())
                    .ok_or(format!("no {kind} named {name}"))?;
                Ok(if value == *n {
                    "ok".into()
                } else {
                    format!("{name} is {value}")
                })
            }
            ["expect", "removals", n] => {
                let got = self.cache()?.take_ssd_removals().len();
                Ok(if got.to_string() == *n {
                    "ok".into()
                } else {
                    format!("{got} removal(s)")
                })
            }
            _ => Err(format!("unknown command `{}`", words.join(" "))),
        }
    }
}

/// Run one script; every mismatch as `file:line: ...`.
fn run_file(path: &Path) -> Vec<String> {
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut run = Run::default();
    let mut failures = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let at = format!("{name}:{}", i + 1);
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let (cmd, expected) = match line.split_once("->") {
            Some((c, e)) => (c.trim(), Some(e.trim())),
            None => (line, None),
        };
        let words: Vec<&str> = cmd.split_whitespace().collect();
        match run.step(&words) {
            Err(script) => {
                failures.push(format!("{at}: bad script line `{line}`: {script}"));
                return failures; // later lines depend on this one
            }
            Ok(got) => match expected {
                Some(want) if got != want => {
                    failures.push(format!("{at}: `{cmd}`: expected `{want}`, got `{got}`"))
                }
                None if got.starts_with("error") || (words[0] == "expect" && got != "ok") => {
                    failures.push(format!("{at}: `{cmd}`: expected success, got `{got}`"))
                }
                _ => {}
            },
        }
        if let Some(c) = run.cache.as_ref()
            && let Err(e) = c.check_invariants()
        {
            failures.push(format!("{at}: invariants broken after `{cmd}`: {e}"));
            return failures;
        }
    }
    failures
}

#[test]
fn scenarios() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no scenarios in {}", dir.display());
    let failures: Vec<String> = files.iter().flat_map(|f| run_file(f)).collect();
    assert!(
        failures.is_empty(),
        "{} mismatch(es):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
