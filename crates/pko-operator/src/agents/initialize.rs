//! PKO's workspace initialization on this operator's agents: before a Workspace is Ready, its agent prepares the source
//! (`pulumi install`), selects (or creates) each of its stacks and sets their config and environments — an
//! `INITIALIZE` run, no Pulumi operation — so a Workspace that cannot be initialized (a `create: false` stack that
//! does not exist, a secrets provider that cannot be used) stalls before any Update is made against it, as PKO's does.
//!
//! Which Workspaces are initialized is the Workspace controller's to decide; this runs one initialization on the
//! Workspace's own agent (at the address its readiness found) or on an agent lent by its class's pool, and says how it
//! went.

use kube::ResourceExt;
use pko_api::Workspace;
use pko_proto::v1::{OperationResult, ResultStatus, operation_event::Event};

use super::request::{self, Incomplete};
use super::{Agents, End, Hold, Lending, Lent, Readiness};

/// How an initialization went.
#[derive(Debug, Clone, PartialEq)]
pub enum Initialization {
    /// The agent ran it: its result, per stack the first that did not succeed (else the last).
    Ran(Box<OperationResult>),
    /// The request could not be made (a Secret or key missing, a config item it cannot carry): the user's to fix, with
    /// the message naming the field.
    Invalid(String),
    /// Not now: no agent free or reachable, or the API server did not answer. Tried again soon.
    Later(String),
}

impl Agents {
    /// Initializes every stack of `ws`, whose readiness is `readiness` (the address of its own agent), exchanging
    /// GitHub App credentials at `github_api_url`, reading Secrets through `secrets`, with this replica's artifact
    /// server `artifact_addr` as a Program artifact's mirror ([`request::mirror_artifact`]).
    pub async fn initialize(
        &self,
        ws: &Workspace,
        readiness: &Readiness,
        github_api_url: &str,
        artifact_addr: &str,
        secrets: &crate::secret_cache::SecretCache,
    ) -> Initialization {
        let ns = ws.namespace().unwrap_or_default();
        let mut last = Initialization::Later("the Workspace has no stacks".into());
        for stack in ws.spec.stacks.iter().flatten() {
            // a new id per attempt: an agent keeps a finished operation's result for its id
            let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
            let id = format!("{ns}/{}/initialize-{}-{at}", ws.name_any(), ws.metadata.generation.unwrap_or_default());
            let built = match request::initialization(&id, &ns, &ws.spec, &stack.name) {
                Ok(mut r) => {
                    request::mirror_artifact(&mut r, &ns, artifact_addr);
                    r
                }
                Err(e) => return Initialization::Invalid(e.to_string()),
            };
            let req = match request::complete(
                &self.client,
                secrets,
                &ns,
                ws.spec.env_from.as_deref().unwrap_or_default(),
                github_api_url,
                built,
            )
            .await
            {
                Ok(r) => r,
                Err(Incomplete::User(m)) => return Initialization::Invalid(m),
                Err(Incomplete::Transient(m)) => return Initialization::Later(m),
            };
            let lent = match self.agent_for_initialization(ws, readiness, &id).await {
                Ok(lent) => lent,
                Err(m) => return Initialization::Later(m),
            };
            last = run(&lent, req).await;
            lent.finish(End::Result);
            if !matches!(&last, Initialization::Ran(r) if r.status == ResultStatus::Succeeded as i32) {
                return last;
            }
        }
        last
    }

    /// The agent to initialize `ws` on: one of its class's pool, lent for operation `id`, or its own at the address
    /// `readiness` found, with the token it wants.
    ///
    /// Errors: no agent free or known, or no token had (the message says which).
    async fn agent_for_initialization(&self, ws: &Workspace, readiness: &Readiness, id: &str) -> Result<Lent, String> {
        let own = (!self.pooled()).then(|| readiness.address.clone()).flatten();
        match self.lend_at(ws, id, 0, false, own, Hold::Never).await {
            Ok(Lending::Lent(lent)) => Ok(lent),
            Ok(Lending::Busy) => Err("every agent of the workspace class is busy".into()),
            // never held (`Hold::Never`): answered for the match's sake
            Ok(Lending::Held(_)) => Err("the workspace class's agent that ran it last is busy".into()),
            Ok(Lending::NoAgent) if self.pooled() => Err("no agent of the workspace class yet".into()),
            Ok(Lending::NoAgent) => Err("the workspace's agent has no address yet".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Runs `req` on `lent` and follows it to its result. An agent that is busy, unreachable or goes away is
/// [`Initialization::Later`]; one that refuses the request as invalid, [`Initialization::Invalid`].
async fn run(lent: &Lent, req: pko_proto::v1::OperationRequest) -> Initialization {
    let later = |e: &dyn std::fmt::Display| Initialization::Later(format!("agent {}: {e}", lent.address));
    let mut agent = match super::client::streaming(&lent.address).await {
        Ok(a) => a,
        Err(e) => return later(&e),
    };
    let call = match super::client::authorized(req, lent.token.as_deref()) {
        Ok(c) => c,
        Err(e) => return later(&e),
    };
    let mut stream = match agent.run(call).await {
        Ok(s) => s.into_inner(),
        Err(s) if s.code() == tonic::Code::InvalidArgument => return Initialization::Invalid(s.message().to_string()),
        Err(s) => return later(&format!("{}: {}", s.code(), s.message())),
    };
    loop {
        match stream.message().await {
            Ok(Some(e)) => {
                if let Some(Event::Result(r)) = e.event {
                    return Initialization::Ran(Box::new(r));
                }
            }
            Ok(None) => return later(&"the stream ended without a result"),
            Err(s) => return later(&format!("{}: {}", s.code(), s.message())),
        }
    }
}
