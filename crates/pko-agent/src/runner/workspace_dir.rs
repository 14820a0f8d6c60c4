//! The workspace directory (PKO's `/share/workspace`): a link pointed at each operation's project, and the program an
//! init container put there.

use std::path::Path;

/// The source of a request that names none (a Workspace without git, flux, local or projectInfo — PKO's "fetch the
/// source yourself" Stack): the program an init container of the workspace pod put in the workspace directory `link`
/// (PKO's `/share/workspace`), when that is a directory of its own rather than the link this agent points at each
/// operation's project.
///
/// Errors: no `--workspace-link`, or nothing but the agent's link (or nothing at all) there — the message says where
/// the program was looked for and how to put it there.
pub(super) fn workspace_source(link: Option<&Path>) -> Result<pko_proto::v1::Source, String> {
    let hint = "a Workspace without a source (git, flux, local) runs the program that an init container of its pod \
        (spec.podTemplate) puts in /share/workspace";
    let Some(link) = link else {
        return Err(format!("the request has no source and this agent has no workspace directory: {hint}"));
    };
    match std::fs::symlink_metadata(link) {
        Ok(m) if m.is_dir() => Ok(pko_proto::v1::Source {
            kind: Some(pko_proto::v1::source::Kind::Local(pko_proto::v1::LocalSource {
                dir: link.display().to_string(),
            })),
        }),
        _ => Err(format!("the request has no source and {} holds no program: {hint}", link.display())),
    }
}

/// Points the symbolic link `link` at `target`, atomically (a new link renamed over the old one).
pub(super) fn point_link(link: &Path, target: &Path) -> std::io::Result<()> {
    let tmp = link.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_link_follows_the_latest_project() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, link) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("workspace"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        point_link(&link, &a).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), a);
        point_link(&link, &b).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), b, "replaced in place");
        let real_dir = dir.path().join("real");
        std::fs::create_dir_all(real_dir.join("x")).unwrap();
        assert!(point_link(&real_dir, &a).is_err(), "a directory in the way is not replaced");
        assert!(real_dir.join("x").is_dir());
    }

    #[test]
    fn a_request_without_a_source_runs_what_an_init_container_put_in_the_workspace_directory() {
        let dir = tempfile::tempdir().unwrap();
        let filled = dir.path().join("workspace");
        std::fs::create_dir_all(&filled).unwrap();
        match workspace_source(Some(&filled)).unwrap().kind {
            Some(pko_proto::v1::source::Kind::Local(l)) => assert_eq!(l.dir, filled.display().to_string()),
            other => panic!("expected the workspace directory as a local source: {other:?}"),
        }
        let link = dir.path().join("link");
        point_link(&link, &filled).unwrap();
        assert!(
            workspace_source(Some(&link)).unwrap_err().contains("holds no program"),
            "the agent's own link is not a program put there"
        );
        assert!(workspace_source(Some(&dir.path().join("missing"))).unwrap_err().contains("init container"));
        assert!(workspace_source(None).unwrap_err().contains("no workspace directory"));
    }
}
