//! `pulumi install` of a fetched revision, after its dependency tree was seeded from an earlier prepared revision
//! with the same manifests where one may seed it ([`crate::seed`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{READY, SourceCache, SourceError, install_err, project_file, safe_join};
use crate::seed::Settle;

/// A seeded revision: how its tree is settled, and whether its project file (`Pulumi.yaml`) is byte for byte the
/// donor's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seeding {
    /// What settles the seed ([`Settle`]).
    pub settle: Settle,
    /// The project file is the donor's: the plugins `pulumi install` would install are the donor's, installed.
    pub same_project: bool,
}

impl SourceCache {
    /// Seeds `project` (a new revision as fetched; `dir` in its source; `manifests` its
    /// [`crate::seed::manifest_digest`]) from the freshest prepared revision that may seed it, off the async threads:
    /// the tree of a donor no operation holds is moved ([`SourceCache::take_over`]), else one is copied (a copy of a
    /// `node_modules` of 15,000 files took 1–10 s on the bed's disk). How the seed is to be settled, or `None` when
    /// it was not seeded.
    pub(super) async fn seed(&self, project: &Path, dir: &str, manifests: &str) -> Option<Seeding> {
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
        // read before a donor is moved and retired
        let projects: Vec<(PathBuf, Option<Vec<u8>>)> =
            donors.iter().map(|(_, donor, _)| (donor.clone(), project_bytes(donor))).collect();
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
        let donor_project = projects.into_iter().find(|(d, _)| *d == seeded.donor).and_then(|(_, bytes)| bytes);
        let same_project = donor_project.is_some() && donor_project == project_bytes(project);
        Some(Seeding { settle: seeded.settle, same_project })
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
    /// settles them ([`Settle::Settled`], or [`Settle::Pip`] once pip checked the seeded virtualenv); not at all when
    /// the seed also leaves the plugins as the donor's ([`plugins_are_the_donors`]).
    ///
    /// Errors: pip's check of a seeded virtualenv or `pulumi install` failed (its error lines).
    pub(super) async fn install(
        &self,
        project: &Path,
        env: &BTreeMap<String, String>,
        seeded: Option<&Seeding>,
    ) -> Result<(), SourceError> {
        let runtime = crate::pulumi::project_info(project).map(|(_, r)| r).unwrap_or_default();
        let inherited = std::env::var(crate::pulumi::DISABLE_PLUGIN_ACQUISITION).ok();
        let downloads_off = crate::pulumi::plugin_acquisition_disabled(env, inherited.as_deref());
        if !install_needed(&runtime, downloads_off) || crate::pulumi::prebuilt_binary(project) {
            return Ok(());
        }
        let (settled, tree_as_donors) = match seeded.map(|s| &s.settle) {
            Some(Settle::Settled) => (true, true),
            Some(Settle::Pip(venv)) => (true, !self.pip_check(project, venv, env).await?),
            Some(Settle::Install) | None => (false, false),
        };
        if tree_as_donors && seeded.is_some_and(|s| plugins_are_the_donors(s.same_project, project)) {
            tracing::info!(project = %project.display(),
                "dependencies settled by the seed, plugins as the donor's: no pulumi install");
            return Ok(());
        }
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
    /// Returns whether pip may have changed the virtualenv ([`pip_changed`]).
    ///
    /// Errors: pip could not run or failed (its error lines).
    async fn pip_check(
        &self,
        project: &Path,
        venv: &Path,
        env: &BTreeMap<String, String>,
    ) -> Result<bool, SourceError> {
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
        let changed = pip_changed(&out.stdout);
        tracing::info!(project = %project.display(), seconds = started.elapsed().as_secs_f64(), changed,
            "pip checked the seeded virtualenv against requirements.txt");
        Ok(changed)
    }
}

/// The bytes of the project file (`Pulumi.yaml` or `Pulumi.yml`) in `dir`; `None` when there is none.
fn project_bytes(dir: &Path) -> Option<Vec<u8>> {
    std::fs::read(project_file(dir)?).ok()
}

/// Whether what `pulumi install --no-dependencies` would do in `project`, whose dependency tree is its donor's as
/// moved or copied, was done for the donor: the plugins a language host requires come from the tree, so they are the
/// donor's when the project file is the donor's too (`same_project`) and names no `plugins` (paths in the project's
/// own files) and no `packages` (SDKs generated into the project). Saves a Pulumi start and the language host's
/// plugin walk (about 0.3 s per new revision on the bed). Reads the project file; a file that does not parse: no.
fn plugins_are_the_donors(same_project: bool, project: &Path) -> bool {
    let Some(bytes) = project_bytes(project).filter(|_| same_project) else { return false };
    let Ok(v) = serde_yaml_ng::from_slice::<serde_yaml_ng::Value>(&bytes) else { return false };
    v.get("plugins").is_none() && v.get("packages").is_none()
}

/// Whether pip's output `stdout` of `pip install -r requirements.txt` says it may have changed the virtualenv: any
/// line but "Requirement already satisfied" and the index notices. Pure.
fn pip_changed(stdout: &str) -> bool {
    const UNCHANGED: &[&str] =
        &["Requirement already satisfied", "Looking in indexes", "Looking in links", "Ignoring "];
    stdout.lines().map(str::trim).filter(|l| !l.is_empty()).any(|l| !UNCHANGED.iter().any(|p| l.starts_with(p)))
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
    fn pip_changed_the_virtualenv_unless_every_requirement_was_satisfied() {
        let satisfied = "Looking in indexes: http://127.0.0.1:1/simple\nRequirement already satisfied: pulumi>=3 in \
            ./venv/lib (3.150.0)\n\nRequirement already satisfied: grpcio in ./venv/lib (1.66.2)\n";
        assert!(!pip_changed(satisfied));
        assert!(!pip_changed(""), "nothing to install");
        let installed = format!(
            "{satisfied}Collecting pyyaml\nInstalling collected packages: pyyaml\n\
            Successfully installed pyyaml-6.0.2\n"
        );
        assert!(pip_changed(&installed));
        assert!(pip_changed("Some line pip may print one day\n"), "what is not known to say nothing changed did");
    }

    #[test]
    fn the_donors_plugins_serve_only_an_unchanged_project_file_without_plugins_or_packages() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("Pulumi.yaml");
        std::fs::write(&file, "name: p\nruntime: nodejs\n").unwrap();
        assert!(plugins_are_the_donors(true, dir.path()));
        assert!(!plugins_are_the_donors(false, dir.path()), "a changed project file may name other plugins");
        std::fs::write(&file, "name: p\nruntime: nodejs\npackages:\n  a: github.com/x/y\n").unwrap();
        assert!(!plugins_are_the_donors(true, dir.path()), "packages generate SDKs into the project");
        std::fs::write(&file, "name: p\nruntime: nodejs\nplugins:\n  providers:\n  - name: x\n    path: ./x\n")
            .unwrap();
        assert!(!plugins_are_the_donors(true, dir.path()), "plugins by path are the project's own files");
        std::fs::write(&file, "name: [p\n").unwrap();
        assert!(!plugins_are_the_donors(true, dir.path()), "a file that does not parse");
        std::fs::remove_file(&file).unwrap();
        assert!(!plugins_are_the_donors(true, dir.path()), "no project file");
    }

    #[test]
    fn every_runtime_is_installed_unless_yaml_may_not_download() {
        for runtime in ["nodejs", "python", "go", "dotnet", "java"] {
            assert!(install_needed(runtime, false) && install_needed(runtime, true), "{runtime}");
        }
        assert!(install_needed("yaml", false), "YAML gets its plugins installed, as in PKO");
        assert!(!install_needed("yaml", true), "with downloads off there is nothing to install");
    }
}
