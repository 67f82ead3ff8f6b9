package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
	"sigs.k8s.io/yaml"
)

// fluxCheck is one entry of a Kustomization's spec.healthCheckExprs.
type fluxCheck struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Current    string `json:"current"`
	InProgress string `json:"inProgress"`
	Failed     string `json:"failed"`
}

type compiled struct {
	current, inProgress, failed cel.Program
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// loadFluxChecks reads every Kustomization in FILE and compiles its healthCheckExprs,
// keyed by group/Kind.
func loadFluxChecks(file string) (map[string]compiled, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	env, err := cel.NewEnv(
		// The features Flux enables for health expressions.
		cel.OptionalTypes(),
		cel.HomogeneousAggregateLiterals(),
		cel.EagerlyValidateDeclarations(true),
		cel.DefaultUTCTimeZone(true),
		cel.CrossTypeNumericComparisons(true),
		ext.Strings(),
		ext.Sets(),
		ext.Encoders(),
	)
	if err != nil {
		return nil, err
	}
	program := func(expr string) (cel.Program, error) {
		if expr == "" {
			return nil, nil
		}
		// Parsed, not type-checked: Flux cannot declare the fields of every kind.
		ast, issues := env.Parse(expr)
		if issues != nil && issues.Err() != nil {
			return nil, fmt.Errorf("parsing %q: %w", expr, issues.Err())
		}
		return env.Program(ast)
	}
	checks := map[string]compiled{}
	for _, doc := range docSeparator.Split(string(b), -1) {
		var k struct {
			Kind string `json:"kind"`
			Spec struct {
				HealthCheckExprs []fluxCheck `json:"healthCheckExprs"`
			} `json:"spec"`
		}
		if strings.TrimSpace(doc) == "" {
			continue
		}
		if err := yaml.Unmarshal([]byte(doc), &k); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if k.Kind != "Kustomization" {
			continue
		}
		for _, hc := range k.Spec.HealthCheckExprs {
			if hc.Current == "" {
				return nil, fmt.Errorf("%s: healthCheckExprs for %s has no current expression", file, hc.Kind)
			}
			var c compiled
			if c.current, err = program(hc.Current); err != nil {
				return nil, err
			}
			if c.inProgress, err = program(hc.InProgress); err != nil {
				return nil, err
			}
			if c.failed, err = program(hc.Failed); err != nil {
				return nil, err
			}
			g := hc.APIVersion
			if i := strings.Index(g, "/"); i >= 0 {
				g = g[:i]
			}
			checks[g+"/"+hc.Kind] = c
		}
	}
	if len(checks) == 0 {
		return nil, fmt.Errorf("%s: no Kustomization with healthCheckExprs", file)
	}
	return checks, nil
}

// fluxHealth evaluates the object's check in Flux's order.
func fluxHealth(checks map[string]compiled, obj map[string]any) Verdict {
	kind, _ := obj["kind"].(string)
	apiVersion, _ := obj["apiVersion"].(string)
	g := apiVersion
	if i := strings.Index(g, "/"); i >= 0 {
		g = g[:i]
	}
	c, ok := checks[g+"/"+kind]
	if !ok {
		return Verdict{Status: "error", Message: "no healthCheckExprs for " + g + "/" + kind}
	}
	meta, _ := obj["metadata"].(map[string]any)
	st, _ := obj["status"].(map[string]any)
	if observed, ok := st["observedGeneration"].(int64); ok {
		if generation, ok := meta["generation"].(int64); ok && observed != generation {
			return Verdict{Status: "InProgress", Message: "observedGeneration differs from generation"}
		}
	}
	for _, step := range []struct {
		prog   cel.Program
		status string
	}{
		{c.inProgress, "InProgress"},
		{c.failed, "Failed"},
		{c.current, "Current"},
	} {
		if step.prog == nil {
			continue
		}
		val, _, err := step.prog.ContextEval(context.Background(), obj)
		if err != nil {
			// Flux's poller reports a resource whose expressions cannot be evaluated
			// (a field not there yet, such as status before the first reconcile) as
			// Unknown and keeps waiting.
			return Verdict{Status: "Unknown", Message: err.Error()}
		}
		b, ok := val.(types.Bool)
		if !ok {
			return Verdict{Status: "error", Message: fmt.Sprintf("%s expression is not boolean", step.status)}
		}
		if bool(b) {
			return Verdict{Status: step.status}
		}
	}
	return Verdict{Status: "InProgress", Message: "no expression holds"}
}
