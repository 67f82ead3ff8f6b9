package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Hand-written objects for the states the Rust test cannot hold still (no status yet)
// and a quick check of the three evaluators; tests/gitops.rs checks real objects.
func TestVerdictsOnHandWrittenObjects(t *testing.T) {
	objects := `[
	 {"apiVersion":"harness-engine.dev/v1alpha1","kind":"MemoryPolicy","metadata":{"name":"fresh","generation":1}},
	 {"apiVersion":"harness-engine.dev/v1alpha1","kind":"MemoryPolicy","metadata":{"name":"ok","generation":2},
	  "status":{"observedGeneration":2,"conditions":[{"type":"Ready","status":"True","reason":"Valid","message":"valid"}]}},
	 {"apiVersion":"harness-engine.dev/v1alpha1","kind":"MemoryPolicy","metadata":{"name":"bad","generation":1},
	  "status":{"observedGeneration":1,"conditions":[{"type":"Ready","status":"False","reason":"WriteScopeNotReadable","message":"m"},
	   {"type":"Stalled","status":"True","reason":"WriteScopeNotReadable","message":"m"}]}},
	 {"apiVersion":"harness-engine.dev/v1alpha1","kind":"SandboxProfile","metadata":{"name":"retrying","generation":1},
	  "status":{"observedGeneration":1,"conditions":[{"type":"Ready","status":"False","reason":"WarmPoolNotFound","message":"m"},
	   {"type":"Reconciling","status":"True","reason":"KubernetesUnavailable","message":"retrying"}]}}
	]`
	var out bytes.Buffer
	err := runEval([]string{"--argocd", "../../deploy/gitops/argocd/health", "--flux", "../../deploy/gitops/flux/kustomization.yaml"},
		strings.NewReader(objects), &out)
	if err != nil {
		t.Fatal(err)
	}
	var reports []Report
	if err := json.Unmarshal(out.Bytes(), &reports); err != nil {
		t.Fatal(err)
	}
	want := map[string][3]string{
		"fresh":    {"Progressing", "Current", "Unknown"},
		"ok":       {"Healthy", "Current", "Current"},
		"bad":      {"Degraded", "Failed", "Failed"},
		"retrying": {"Progressing", "InProgress", "InProgress"},
	}
	for _, r := range reports {
		got := [3]string{r.ArgoCD.Status, r.KStatus.Status, r.Flux.Status}
		if got != want[r.Name] {
			t.Errorf("%s: got argocd/kstatus/flux %v, want %v (%+v)", r.Name, got, want[r.Name], r)
		}
	}
}

func TestTheConfigMapCarriesEveryScript(t *testing.T) {
	scripts, err := loadHealthScripts("../../deploy/gitops/argocd/health")
	if err != nil {
		t.Fatal(err)
	}
	cm := argoCDConfigMap(scripts)
	for _, kind := range []string{"HarnessBinding", "SandboxProfile", "MemoryPolicy"} {
		if !strings.Contains(cm, "resource.customizations.health.harness-engine.dev_"+kind+": |") {
			t.Errorf("no entry for %s", kind)
		}
	}
}

func TestTheExampleManifestsAreValid(t *testing.T) {
	if err := runValidate([]string{"--repo", "../.."}); err != nil {
		t.Fatal(err)
	}
}

func TestAMisspeltFluxFieldIsRefused(t *testing.T) {
	doc := []byte("apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {name: x}\nspec:\n  path: ./config/default\n  healthCheckExpr: []\n  sourceRef: {kind: GitRepository, name: x}\n  interval: 1m\n  prune: true\n")
	if _, err := validateDoc("../..", doc); err == nil || !strings.Contains(err.Error(), "healthCheckExpr") {
		t.Fatalf("a misspelt field passed: %v", err)
	}
}
