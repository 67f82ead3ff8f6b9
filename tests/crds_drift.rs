//! `crds/` and `config/crd/bases/` are generated from `src/api` and committed. This fails
//! when a CRD type changed without `make crds`, so what users install is always what the
//! code reads.

use harness_engine::api::crds;

#[test]
fn committed_crds_match_the_code() {
    check_dir("crds");
}

#[test]
fn kustomize_crds_match_the_code() {
    check_dir("config/crd/bases");
}

fn check_dir(rel: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let mut expected_files = Vec::new();
    for crd in crds::all() {
        let name = crds::file_name(&crd);
        let want = crds::to_yaml(&crd).expect("render");
        let path = dir.join(&name);
        let have = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            panic!(
                "{} is missing: run `make crds` and commit crds/",
                path.display()
            )
        });
        assert!(
            have == want,
            "{} is stale: run `make crds` and commit crds/",
            path.display()
        );
        expected_files.push(name);
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("crds/ exists")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    present.sort();
    expected_files.sort();
    assert_eq!(
        present, expected_files,
        "crds/ holds a file no CRD type generates: run `make crds`"
    );
}
