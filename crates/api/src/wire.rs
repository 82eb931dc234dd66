//! The control socket's protocol, and its client ([`request`]).
//!
//! Protocol: one JSON request line from the client (a [`Request`]); the
//! server answers, for a long request it runs as a job (`jobs`), with one
//! `{"job":JOBINFO}` line first; then zero or more
//! `{"progress":[done,total]}` lines, then one line that is
//! `{"ok":RESPONSE}` (a [`Response`], tagged by its kind) or
//! `{"error":{"kind":K,"message":M}}` (a [`ReplyError`], with
//! `"place":{"object":O,"offset":N,"op":P}` when the error names where,
//! each member only when known), and closes. Each line is a [`Reply`], so
//! both ends read and write the same types. A client that closes the
//! connection early leaves the job running.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};
use strata_block::{Error, Kind as ErrorKind, Place};

use crate::job::JobInfo;
use crate::request::Request;
use crate::response::Response;

/// One line from the server.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// The job the request runs as.
    Job(JobInfo),
    /// Work done so far, out of a total (bytes, or whatever the request counts).
    Progress([u64; 2]),
    Ok(Box<Response>),
    Error(ReplyError),
}

/// An error as the control socket and the HTTP API answer it (the body
/// of `{"error":...}`): strata's [`Error`] but for its cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyError {
    /// The [`ErrorKind`] by name (see [`ErrorKind::name`]).
    kind: String,
    message: String,
    /// Where (the object key, file or disk; the offset; the operation):
    /// absent when nothing of it is known, and in the answers of servers
    /// older than this member.
    #[serde(default, skip_serializing_if = "Place::is_empty")]
    place: Place,
}

impl From<&Error> for ReplyError {
    fn from(e: &Error) -> Self {
        ReplyError {
            kind: e.kind.name().to_string(),
            message: e.message.clone(),
            place: e.place.clone(),
        }
    }
}

impl From<ReplyError> for Error {
    /// The error again, on the client: a kind this build does not know is
    /// `Io` ([`ErrorKind::from_name`]).
    fn from(e: ReplyError) -> Self {
        let mut err = Error::new(ErrorKind::from_name(&e.kind), e.message);
        err.place = e.place;
        err
    }
}

impl Reply {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Reply {
        Reply::Error(ReplyError {
            kind: kind.name().to_string(),
            message: message.into(),
            place: Place::default(),
        })
    }

    /// `e` answered: its kind, message and place.
    pub fn failed(e: &Error) -> Reply {
        Reply::Error(e.into())
    }

    pub fn line(&self) -> String {
        serde_json::to_string(self).expect("serialisable")
    }
}

/// What a client sees of a request while the server runs it.
pub trait Watch {
    /// The server runs the request as job `job` (said once, at its start).
    fn started(&mut self, job: &JobInfo) {
        let _ = job;
    }
    /// `done` of `total` (bytes, or the work's own unit).
    fn progress(&mut self, done: u64, total: u64);
}

/// A closure watches the progress alone.
impl<F: FnMut(u64, u64)> Watch for F {
    fn progress(&mut self, done: u64, total: u64) {
        self(done, total)
    }
}

/// Send a request to a running server and wait for its answer, telling
/// `watch` of its job and progress.
///
/// A long request runs as a job of the server: with `detach`, this returns
/// as soon as the job has started (`Response::JobStarted`).
pub fn request(
    socket: &Path,
    req: &Request,
    detach: bool,
    watch: &mut dyn Watch,
) -> Result<Response, Error> {
    let mut s = UnixStream::connect(socket).map_err(|e| {
        Error::new(
            ErrorKind::Locked,
            format!(
                "the datastore is in use and its server does not answer at {}: {e}",
                socket.display()
            ),
        )
    })?;
    let mut line = serde_json::to_string(req).expect("serialisable");
    line.push('\n');
    let sent = s.write_all(line.as_bytes());
    // The line may hold a secret: wiped like the `Secret` it came from.
    crate::key::wipe_string(line);
    sent.map_err(|e| Error::new(ErrorKind::Io, format!("control socket: {e}")))?;
    let reader = BufReader::new(s);
    for line in reader.lines() {
        let line = line.map_err(|e| Error::new(ErrorKind::Io, format!("control socket: {e}")))?;
        let reply: Reply = serde_json::from_str(&line)
            .map_err(|e| Error::new(ErrorKind::Io, format!("bad answer from server: {e}")))?;
        match reply {
            Reply::Job(info) if detach => return Ok(Response::JobStarted(info)),
            Reply::Job(info) => watch.started(&info),
            Reply::Progress([done, total]) => watch.progress(done, total),
            Reply::Ok(r) => return Ok(*r),
            Reply::Error(e) => return Err(e.into()),
        }
    }
    Err(Error::new(
        ErrorKind::Io,
        "the server closed the control connection without an answer",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines_keep_their_shapes() {
        assert_eq!(Reply::Progress([1, 2]).line(), r#"{"progress":[1,2]}"#);
        assert_eq!(
            Reply::error(ErrorKind::NotFound, "no disk named 'x'").line(),
            r#"{"error":{"kind":"not_found","message":"no disk named 'x'"}}"#
        );
        let ok = Reply::Ok(Box::new(Response::Removed { name: "vm".into() })).line();
        assert_eq!(ok, r#"{"ok":{"removed":{"name":"vm"}}}"#);
        match serde_json::from_str::<Reply>(&ok).unwrap() {
            Reply::Ok(r) => match *r {
                Response::Removed { name } => assert_eq!(name, "vm"),
                other => panic!("decoded as {other:?}"),
            },
            other => panic!("decoded as {other:?}"),
        }
    }

    #[test]
    fn an_errors_place_survives_the_socket() {
        let sent = Error::new(ErrorKind::Unavailable, "no answer in 5 s")
            .at("s3://b/p/disks/0000000a/m/0000000000000002")
            .offset(4096)
            .op("get");
        let line = Reply::failed(&sent).line();
        assert_eq!(
            line,
            r#"{"error":{"kind":"unavailable","message":"no answer in 5 s","place":{"object":"s3://b/p/disks/0000000a/m/0000000000000002","offset":4096,"op":"get"}}}"#
        );
        let Reply::Error(e) = serde_json::from_str::<Reply>(&line).unwrap() else {
            panic!("{line}");
        };
        let got = Error::from(e);
        assert_eq!((got.kind, &got.message), (sent.kind, &sent.message));
        assert_eq!(got.place, sent.place);
        assert_eq!(got.to_string(), sent.to_string());

        // Only what is known of the place is sent, and none of it when
        // nothing is: the line an older server sends, which still reads.
        let line = Reply::failed(&Error::new(ErrorKind::Corrupt, "bad").at("vm.vmdk")).line();
        assert_eq!(
            line,
            r#"{"error":{"kind":"corrupt","message":"bad","place":{"object":"vm.vmdk"}}}"#
        );
        let line = Reply::failed(&Error::new(ErrorKind::NotFound, "no disk named 'x'")).line();
        assert_eq!(
            line,
            r#"{"error":{"kind":"not_found","message":"no disk named 'x'"}}"#
        );
        let Reply::Error(e) = serde_json::from_str::<Reply>(&line).unwrap() else {
            panic!("{line}");
        };
        assert!(Error::from(e).place.is_empty());
    }

    #[test]
    fn every_error_kind_survives_the_socket() {
        for k in ErrorKind::ALL {
            let line = Reply::error(k, "m").line();
            match serde_json::from_str::<Reply>(&line).unwrap() {
                Reply::Error(e) => assert_eq!(ErrorKind::from_name(&e.kind), k, "{line}"),
                other => panic!("decoded as {other:?}"),
            }
        }
    }
}
