// gitops-check evaluates what the GitOps tools would say about Harness Engine objects,
// with the same libraries those tools use, so tests/gitops.rs can check the manifests in
// deploy/gitops/ against real objects from the local control plane:
//
//   - Argo CD: the health Lua in deploy/gitops/argocd/health/, run by gopher-lua (the
//     interpreter Argo CD embeds) with `obj` set to the object, as Argo CD runs
//     `resource.customizations.health.<group>_<Kind>`;
//   - kstatus: sigs.k8s.io/cli-utils status.Compute, the library Flux and kpt use;
//   - Flux: the `healthCheckExprs` of the Kustomization in deploy/gitops/flux/, with
//     cel-go, in the order Flux documents (RFC 0009): a status.observedGeneration that
//     differs from metadata.generation is InProgress, then `inProgress`, `failed` and
//     `current` are tried in turn, and InProgress when none holds.
//
// Usage:
//
//	gitops-check eval --argocd DIR --flux FILE < objects.json   (a JSON array of objects)
//	gitops-check argocd-cm --argocd DIR                         (prints the argocd-cm snippet)
//	gitops-check validate --repo ROOT                           (checks deploy/gitops/)
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gitops-check eval|argocd-cm|validate [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "eval":
		err = runEval(os.Args[2:], os.Stdin, os.Stdout)
	case "argocd-cm":
		err = runArgoCDConfigMap(os.Args[2:], os.Stdout)
	case "validate":
		err = runValidate(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q (want eval, argocd-cm or validate)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gitops-check:", err)
		os.Exit(1)
	}
}

// Verdict is what one tool says about one object.
type Verdict struct {
	Status  string `json:"status"`
	Message string `json:"message,omitempty"`
}

// Report is every tool's verdict on one object.
type Report struct {
	Kind    string  `json:"kind"`
	Name    string  `json:"name"`
	ArgoCD  Verdict `json:"argocd"`
	KStatus Verdict `json:"kstatus"`
	Flux    Verdict `json:"flux"`
}

func runEval(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	argoDir := fs.String("argocd", "", "directory of <Kind>.lua health scripts")
	fluxFile := fs.String("flux", "", "Flux Kustomization manifest with healthCheckExprs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *argoDir == "" || *fluxFile == "" {
		return fmt.Errorf("eval needs --argocd and --flux")
	}
	scripts, err := loadHealthScripts(*argoDir)
	if err != nil {
		return err
	}
	checks, err := loadFluxChecks(*fluxFile)
	if err != nil {
		return err
	}
	var objects []map[string]any
	dec := json.NewDecoder(in)
	dec.UseNumber()
	if err := dec.Decode(&objects); err != nil {
		return fmt.Errorf("reading objects from stdin: %w", err)
	}
	reports := make([]Report, 0, len(objects))
	for i, obj := range objects {
		obj = normalizeNumbers(obj).(map[string]any)
		kind, _ := obj["kind"].(string)
		meta, _ := obj["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if kind == "" || name == "" {
			return fmt.Errorf("object %d has no kind or metadata.name", i)
		}
		r := Report{Kind: kind, Name: name}
		r.ArgoCD = argoHealth(scripts, obj)
		r.KStatus = kstatusOf(obj)
		r.Flux = fluxHealth(checks, obj)
		reports = append(reports, r)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(reports)
}

// normalizeNumbers turns json.Number into int64 where it is integral (what the
// Kubernetes unstructured decoder yields), float64 otherwise.
func normalizeNumbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = normalizeNumbers(e)
		}
		return t
	case []any:
		for i, e := range t {
			t[i] = normalizeNumbers(e)
		}
		return t
	case json.Number:
		if n, err := t.Int64(); err == nil {
			return n
		}
		f, _ := t.Float64()
		return f
	default:
		return v
	}
}
