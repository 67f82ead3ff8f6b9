package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"sigs.k8s.io/yaml"
)

// runValidate checks the example manifests under ROOT/deploy/gitops: every Flux object
// decodes strictly into Flux's own API types (an unknown or misspelt field is an
// error), every Argo CD Application names the fields Argo CD requires, and every path
// they point at (chart, kustomize directory) exists in the repository.
func runValidate(args []string) error {
	root := ""
	for i := 0; i < len(args); i++ {
		if args[i] == "--repo" && i+1 < len(args) {
			root = args[i+1]
			i++
		}
	}
	if root == "" {
		return fmt.Errorf("validate needs --repo ROOT")
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy/gitops/*/*.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no manifests under %s/deploy/gitops", root)
	}
	var problems []string
	seen := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, f)
		for i, doc := range docSeparator.Split(string(b), -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			kind, err := validateDoc(root, []byte(doc))
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s (document %d): %v", rel, i+1, err))
			}
			seen[kind]++
		}
	}
	for _, kind := range []string{"Application", "GitRepository", "HelmRelease", "Kustomization"} {
		if seen[kind] == 0 {
			problems = append(problems, "no "+kind+" among the examples")
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid example manifests:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

func validateDoc(root string, doc []byte) (string, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return "", err
	}
	exists := func(what, rel string) error {
		st, err := os.Stat(filepath.Join(root, filepath.Clean(rel)))
		if err != nil || !st.IsDir() {
			return fmt.Errorf("%s %q is not a directory of this repository", what, rel)
		}
		return nil
	}
	switch head.APIVersion + "/" + head.Kind {
	case "source.toolkit.fluxcd.io/v1/GitRepository":
		var o sourcev1.GitRepository
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return head.Kind, err
		}
		if o.Spec.URL == "" {
			return head.Kind, fmt.Errorf("spec.url is empty")
		}
	case "helm.toolkit.fluxcd.io/v2/HelmRelease":
		var o helmv2.HelmRelease
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return head.Kind, err
		}
		if o.Spec.Chart == nil || o.Spec.Chart.Spec.SourceRef.Kind != sourcev1.GitRepositoryKind {
			return head.Kind, fmt.Errorf("spec.chart must name a chart in a GitRepository")
		}
		return head.Kind, exists("chart", o.Spec.Chart.Spec.Chart)
	case "kustomize.toolkit.fluxcd.io/v1/Kustomization":
		var o kustomizev1.Kustomization
		if err := yaml.UnmarshalStrict(doc, &o); err != nil {
			return head.Kind, err
		}
		for _, hc := range o.Spec.HealthCheckExprs {
			if hc.Current == "" {
				return head.Kind, fmt.Errorf("healthCheckExprs for %s has no current", hc.Kind)
			}
		}
		return head.Kind, exists("path", o.Spec.Path)
	case "argoproj.io/v1alpha1/Application":
		// Argo CD's API types come only with its whole module; check what it requires.
		var o struct {
			Spec struct {
				Project string `json:"project"`
				Source  struct {
					RepoURL        string `json:"repoURL"`
					TargetRevision string `json:"targetRevision"`
					Path           string `json:"path"`
				} `json:"source"`
				Destination struct {
					Server    string `json:"server"`
					Namespace string `json:"namespace"`
				} `json:"destination"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(doc, &o); err != nil {
			return head.Kind, err
		}
		s := o.Spec
		if s.Project == "" || s.Source.RepoURL == "" || s.Destination.Server == "" || s.Destination.Namespace == "" {
			return head.Kind, fmt.Errorf("an Application needs spec.project, spec.source.repoURL and spec.destination server and namespace")
		}
		return head.Kind, exists("source.path", s.Source.Path)
	case "v1/ConfigMap":
		// argocd-cm.yaml: checked against the Lua files by tests/gitops.rs.
	default:
		return head.Kind, fmt.Errorf("unexpected %s %s", head.APIVersion, head.Kind)
	}
	return head.Kind, nil
}
