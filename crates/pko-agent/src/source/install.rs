//! `pulumi install` of a fetched revision, after its dependency tree was seeded from an earlier prepared revision
//! with the same manifests where one may seed it ([`crate::seed`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{READY, SourceCache, SourceError, install_err, safe_join};
use crate::seed::Settle;

impl SourceCache {
    /// Seeds `project` (a new revision as fetched; `dir` in its source; `manifests` its
    /// [`crate::seed::manifest_digest`]) from the freshest prepared revision that may seed it, off the async threads:
    /// the tree of a donor no operation holds is moved ([`SourceCache::take_over`]), else one is copied (a copy of a
    /// `node_modules` of 15,000 files took 1–10 s on the bed's disk). How the seed is to be settled, or `None` when
    /// it was not seeded.
    pub(super) async fn seed(&self, project: &Path, dir: &str, manifests: &str) -> Option<Settle> {
        if !self.cfg.seed_dependency_trees || manifests.is_empty() {
            return None;
        }
        let donors: Vec<(String, PathBuf, String)> = self
            .entries()
            .into_iter()
            .filter_map(|e| {
                let entry = self.cfg.root.join(&e.key);
                let recorded = std::fs::read_to_string(entry.join(READY)).ok()?;
                Some((e.key, safe_join(&entry, dir).ok()?, recorded))
            })
            .filter(|(_, donor, recorded)| recorded == manifests && donor != project)
            .collect();
        let started = std::time::Instant::now();
        let mut seeded = None;
        for (key, donor, _) in &donors {
            seeded = self.take_over(key, donor, project, manifests).await;
            if seeded.is_some() {
                break;
            }
        }
        if seeded.is_none() {
            let (target, digest) = (project.to_path_buf(), manifests.to_string());
            let donors = donors.into_iter().map(|(_, donor, recorded)| (donor, recorded));
            let donors: Vec<_> = donors.collect();
            seeded = tokio::task::spawn_blocking(move || crate::seed::seed(&target, &digest, donors)).await.ok()?;
        }
        let seeded = seeded?;
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!(project = %project.display(), donor = %seeded.donor.display(), seconds, settle = ?seeded.settle,
            moved = seeded.moved, "seeded the dependency tree from a revision with the same manifests");
        Some(seeded.settle)
    }

    /// Moves the tree of the prepared revision `key` (its project directory `donor`) into `project`
    /// ([`crate::seed::take`]) when no operation holds it and no preparation of it is under way (its lock, held
    /// throughout, keeps any from starting). Only once the donor may seed `project` is it retired: its ready marker
    /// removed, and its directory after the move; a donor that may not seed this project stays ready and intact (one
    /// whose tree changed is discarded). `None` when it is held or did not seed.
    async fn take_over(&self, key: &str, donor: &Path, project: &Path, digest: &str) -> Option<crate::seed::Seeded> {
        let lock = self.lock_of(key);
        let _guard = lock.try_lock().ok()?;
        if self.is_in_use(key) {
            return None;
        }
        let entry = self.cfg.root.join(key);
        let (donor, project, digest, ready) =
            (donor.to_path_buf(), project.to_path_buf(), digest.to_string(), entry.join(READY));
        let taken = tokio::task::spawn_blocking(move || {
            crate::seed::take(&project, &digest, &donor, || std::fs::remove_file(&ready).is_ok())
        })
        .await
        .ok()?;
        if taken.retired {
            self.forget_size(key);
            if let Err(e) = crate::trees::remove_tree(&entry) {
                tracing::warn!(entry = %entry.display(), error = %e, "removing a retired revision");
            }
        }
        taken.seeded
    }

    /// `pulumi install` in `project`, for every runtime as PKO's workspaces do (language dependencies, provider
    /// plugins, `packages`), unless there is nothing it could install; without the language dependencies when a seed
    /// settles them ([`Settle::Settled`], or [`Settle::Pip`] once pip checked the seeded virtualenv).
    ///
    /// Errors: pip's check of a seeded virtualenv or `pulumi install` failed (its error lines).
    pub(super) async fn install(
        &self,
        project: &Path,
        env: &BTreeMap<String, String>,
        seeded: Option<&Settle>,
    ) -> Result<(), SourceError> {
        let runtime = crate::pulumi::project_info(project).map(|(_, r)| r).unwrap_or_default();
        let inherited = std::env::var(crate::pulumi::DISABLE_PLUGIN_ACQUISITION).ok();
        let downloads_off = crate::pulumi::plugin_acquisition_disabled(env, inherited.as_deref());
        if !install_needed(&runtime, downloads_off) || crate::pulumi::prebuilt_binary(project) {
            return Ok(());
        }
        let settled = match seeded {
            Some(Settle::Settled) => true,
            Some(Settle::Pip(venv)) => self.pip_check(project, venv, env).await.map(|()| true)?,
            Some(Settle::Install) | None => false,
        };
        let args: &[&str] = if settled { &["install", "--no-dependencies"] } else { &["install"] };
        if settled {
            tracing::info!(project = %project.display(), "dependencies settled by the seed: install --no-dependencies");
        }
        let out = crate::pulumi::run(&self.cfg.pulumi, project, env, args)
            .await
            .map_err(|e| install_err(format!("pulumi install: {e}")))?;
        if !out.success {
            return Err(install_err(format!("pulumi install failed: {}", crate::pulumi::error_text(&out.stderr))));
        }
        Ok(())
    }

    /// `python -m pip install -r requirements.txt` in `project` with the seeded virtualenv `venv` (its `python`, the
    /// variables Pulumi's pip toolchain sets: `VIRTUAL_ENV`, its `bin` first on `PATH`), under the CLI's supervisor.
    async fn pip_check(&self, project: &Path, venv: &Path, env: &BTreeMap<String, String>) -> Result<(), SourceError> {
        let python =
            crate::pulumi::Cli { bin: venv.join("bin/python"), supervisor: self.cfg.pulumi.supervisor.clone() };
        let mut env = env.clone();
        let path = env.get("PATH").cloned().or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
        env.insert("PATH".into(), format!("{}:{path}", venv.join("bin").display()));
        env.insert("VIRTUAL_ENV".into(), venv.display().to_string());
        let started = std::time::Instant::now();
        let args = ["-m", "pip", "install", "--disable-pip-version-check", "-r", "requirements.txt"];
        let out = crate::pulumi::run(&python, project, &env, &args)
            .await
            .map_err(|e| install_err(format!("pip install -r requirements.txt (the seeded virtualenv): {e}")))?;
        if !out.success {
            let text = crate::pulumi::error_text(&out.stderr);
            return Err(install_err(format!("pip install -r requirements.txt (the seeded virtualenv) failed: {text}")));
        }
        tracing::info!(project = %project.display(), seconds = started.elapsed().as_secs_f64(),
            "pip checked the seeded virtualenv against requirements.txt");
        Ok(())
    }
}

/// Whether a fetched source of `runtime` gets `pulumi install`. Always, as in PKO (but never for a prebuilt
/// `runtime.options.binary`, [`crate::pulumi::prebuilt_binary`]), except YAML when plugin acquisition is disabled (the
/// air-gapped setting): for YAML `pulumi install` only downloads plugins and packages, so with downloads off the
/// plugins must already be on `PATH` or in the plugin cache, and `pulumi up` finds them there.
fn install_needed(runtime: &str, acquisition_disabled: bool) -> bool {
    runtime != "yaml" || !acquisition_disabled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_runtime_is_installed_unless_yaml_may_not_download() {
        for runtime in ["nodejs", "python", "go", "dotnet", "java"] {
            assert!(install_needed(runtime, false) && install_needed(runtime, true), "{runtime}");
        }
        assert!(install_needed("yaml", false), "YAML gets its plugins installed, as in PKO");
        assert!(!install_needed("yaml", true), "with downloads off there is nothing to install");
    }
}
