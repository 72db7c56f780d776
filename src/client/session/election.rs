//! Leader election on a session ([`Session::election`]): campaign (an
//! exclusive session hold of the election's name whose source is the
//! candidate's value), proclaim (a new value, the same leadership and
//! token), resign (the release), and observe (a watch of the name, read as
//! "who leads now").
//!
//! Candidates are served in the order they campaigned (the key's FIFO
//! queue); a leader whose session ends (its process killed, its connection
//! lost past the keep-alive) is replaced by the next candidate at once, and
//! every observer is told, with the new leader's fencing token.

use std::time::{Duration, Instant};

use super::io::{Op, Waited, What};
use super::watch::Watch;
use super::{check_key, Acquire, Hold, LockOptions, Session, Wait};
use crate::lease::{cause_msg, Error, Lease, LostLock, LostReason, Result};
use crate::protocol::session::{self as wire, Access, EventKind, Req, Status};

/// The longest value: a holder's source on the session protocol, 1..=255
/// bytes (an empty source would be the client's IP address).
pub const VALUE_MAX: usize = super::SOURCE_LEN_MAX;

/// An election: a name on one session's server. Made by
/// [`Session::election`]; cheap to clone.
#[derive(Clone)]
pub struct Election {
    session: Session,
    name: Vec<u8>,
}

/// Who leads an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's fencing token: strictly larger for every new leader
    /// (a proclaim keeps it).
    pub token: u64,
    /// The value it campaigned with, or its latest proclaim.
    pub value: Vec<u8>,
}

/// This process leads: made by [`Election::campaign`]. Leadership lasts
/// until [`resign`](Self::resign), the drop of this value (which resigns),
/// or the end of the session (then the [`Lease`]'s lost-lock handlers run:
/// [`lease`](Self::lease)).
pub struct Leadership {
    election: Election,
    lease: Lease,
    value: Vec<u8>,
}

/// The leader of an election now and at every change: made by
/// [`Election::observe`].
pub struct Observer {
    watch: Watch,
    leader: Option<Leader>,
    /// The iterator gave the observation's end.
    done: bool,
}

fn check_value(value: &[u8]) -> Result<()> {
    if value.is_empty() || value.len() > VALUE_MAX {
        return Err(Error::InvalidArgument(format!(
            "an election value is 1 to {VALUE_MAX} bytes, got {}",
            value.len()
        )));
    }
    Ok(())
}

impl Session {
    /// The election named `name` (1..=127 bytes, a key of the server's:
    /// use it for nothing else) on this session's server.
    pub fn election(&self, name: impl AsRef<[u8]>) -> Result<Election> {
        let name = name.as_ref();
        check_key(name)?;
        Ok(Election {
            session: self.clone(),
            name: name.to_vec(),
        })
    }

    /// Whether the server takes Proclaim (its welcome's proclaim flag;
    /// after a resume, the new server's).
    pub fn offers_proclaim(&self) -> bool {
        self.shared().lock().proclaim
    }
}

impl Election {
    /// The election's name.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// Campaigns with `value` (1..=255 bytes) and waits to lead, up to
    /// `timeout` (`None`: until elected or the session ends). Candidates
    /// are elected in the order they campaigned. `Err(Error::Timeout)`
    /// when `timeout` passed first (the campaign is withdrawn).
    pub fn campaign(
        &self,
        value: impl AsRef<[u8]>,
        timeout: Option<Duration>,
    ) -> Result<Leadership> {
        self.campaign_with(value, timeout, &LockOptions::default())
    }

    /// [`campaign`](Self::campaign) with a lost-leadership handler and the
    /// caller's cancellation ([`LockOptions`]).
    pub fn campaign_with(
        &self,
        value: impl AsRef<[u8]>,
        timeout: Option<Duration>,
        opts: &LockOptions,
    ) -> Result<Leadership> {
        let value = value.as_ref();
        check_value(value)?;
        let what = Acquire {
            hold: Hold::Session,
            wait: timeout.map_or(Wait::Forever, Wait::For),
            access: Access::Exclusive,
        };
        let lease = self
            .session
            .acquire_as(&self.name, what, opts, Some(value))?;
        Ok(Leadership {
            election: self.clone(),
            lease,
            value: value.to_vec(),
        })
    }

    /// The leader now (`None`: nobody leads), read once.
    pub fn leader(&self) -> Result<Option<Leader>> {
        let w = self.session.watch(&self.name)?;
        let leader = leader_of(&w);
        let _ = w.close();
        Ok(leader)
    }

    /// Observes the election: [`Observer::leader`] is the leader now, and
    /// [`Observer::changed`] (or the iterator) gives every change after it
    /// in order: a new leader, a proclaim, and `None` between a leader's
    /// end and the next one's election. Like a [`Watch`], it lives on the
    /// session's connection: when the connection fails or the session
    /// ends, it ends with the reason; observe again to read the leader
    /// anew.
    pub fn observe(&self) -> Result<Observer> {
        let watch = self.session.watch(&self.name)?;
        let leader = leader_of(&watch);
        Ok(Observer {
            watch,
            leader,
            done: false,
        })
    }
}

fn leader_of(w: &Watch) -> Option<Leader> {
    w.holders().first().map(|h| Leader {
        token: h.token,
        value: h.source.clone(),
    })
}

impl Leadership {
    /// The leadership's fencing token.
    pub fn token(&self) -> u64 {
        self.lease.token().expect("a session hold has a token")
    }

    /// The value observers see.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The hold behind the leadership: [`Lease::lost`], lost-lock
    /// handlers.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Changes the leader's value to `value` (1..=255 bytes), keeping the
    /// leadership and its token; every observer is told. Waits for the
    /// server's answer up to the session's release timeout. Errors: a
    /// server without Proclaim ([`Error::Unsupported`], nothing sent);
    /// leadership gone ([`Error::Lost`]); no answer, the server's refusal
    /// ([`Error::Failed`]): the value may or may not have changed.
    pub fn proclaim(&mut self, value: impl AsRef<[u8]>) -> Result<()> {
        let value = value.as_ref();
        check_value(value)?;
        let name_text = String::from_utf8_lossy(&self.election.name).into_owned();
        let failed = |why: String| Error::Failed {
            key: name_text.clone(),
            cause: cause_msg(why),
        };
        let session = &self.election.session;
        if !session.offers_proclaim() {
            return Err(Error::Unsupported(format!(
                "a proclaim in election {name_text:?}: this server does not offer it (its \
                 welcome lacks the proclaim flag: a ringlockd older than proclaim); nothing \
                 was sent"
            )));
        }
        let token = self.token();
        let key = &self.election.name[..];
        let sh = session.shared();
        let rid = sh
            .send(
                What::Call,
                Op::Proclaim((key.to_vec(), token)),
                |rid, out| {
                    wire::encode(
                        rid,
                        &Req::Proclaim {
                            token,
                            key,
                            source: value,
                        },
                        out,
                    )
                },
            )
            .map_err(|(reason, cause)| {
                Error::Lost(LostLock::new(
                    name_text.clone(),
                    reason,
                    Some(cause_msg(format!(
                        "the session ended before the proclaim: {cause}"
                    ))),
                ))
            })?;
        match sh.wait(rid, Some(Instant::now() + sh.release_timeout)) {
            Waited::Answer(a, _) => match a.status {
                Status::Ok => {
                    self.value = value.to_vec();
                    Ok(())
                }
                s @ (Status::Stale | Status::NotOwner) => Err(Error::Lost(LostLock::new(
                    name_text.clone(),
                    LostReason::NotHeld,
                    Some(cause_msg(format!(
                        "proclaim answered {}: token {token} no longer leads",
                        s.name()
                    ))),
                ))),
                Status::Limit => Err(failed(
                    "the server's limit on names (--max-keys + --max-waiters) refused the value"
                        .into(),
                )),
                s => Err(failed(format!("the server answered {}", s.name()))),
            },
            Waited::Dead((reason, cause)) => Err(Error::Lost(LostLock::new(
                name_text.clone(),
                reason,
                Some(cause_msg(format!(
                    "the session ended before the proclaim was answered: {cause}"
                ))),
            ))),
            Waited::NoAnswer => Err(failed(format!(
                "no answer within the release timeout ({:?}); the value may or may not have \
                 changed",
                sh.release_timeout
            ))),
        }
    }

    /// Gives up the leadership: the next candidate is elected, observers
    /// are told.
    pub fn resign(self) -> Result<()> {
        self.lease.release()
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &String::from_utf8_lossy(&self.election.name))
            .field("token", &self.lease.token())
            .field("value", &String::from_utf8_lossy(&self.value))
            .finish()
    }
}

impl Observer {
    /// The leader as last observed (`None`: nobody leads).
    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// Waits up to `timeout` (`None`: until one comes) for the leader to
    /// change; `Ok(true)`: it did ([`leader`](Self::leader) is the new
    /// one), `Ok(false)`: not within `timeout`. `Err`: the observation
    /// ended (observe again).
    pub fn changed(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let until = timeout.map(|t| Instant::now() + t);
        loop {
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            let Some(e) = self.watch.next(left)? else {
                return Ok(false);
            };
            let h = e.holder;
            let now = match e.kind {
                EventKind::Granted => Some(Leader {
                    token: h.token,
                    value: h.source,
                }),
                EventKind::Proclaimed
                    if self.leader.as_ref().is_some_and(|l| l.token == h.token) =>
                {
                    Some(Leader {
                        token: h.token,
                        value: h.source,
                    })
                }
                k if k.ends_hold() && self.leader.as_ref().is_some_and(|l| l.token == h.token) => {
                    None
                }
                // A holder this observer does not count as the leader.
                _ => continue,
            };
            if now != self.leader {
                self.leader = now;
                return Ok(true);
            }
        }
    }

    /// Ends the observation (its watch).
    pub fn close(self) -> Result<()> {
        self.watch.close()
    }
}

impl Iterator for Observer {
    type Item = Result<Option<Leader>>;

    /// The leader after each change; after the observation ended, one
    /// `Err` saying why, then `None`.
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.changed(None) {
            Ok(_) => Some(Ok(self.leader.clone())),
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("watch", &self.watch)
            .field("leader", &self.leader)
            .finish()
    }
}
