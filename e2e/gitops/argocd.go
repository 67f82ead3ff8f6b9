package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	lua "github.com/yuin/gopher-lua"
)

// group is the API group of every kind the scripts cover.
const group = "harness-engine.dev"

// The health values Argo CD accepts from a script.
var argoStatuses = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true,
	"Suspended": true, "Missing": true, "Unknown": true,
}

// loadHealthScripts reads DIR/<Kind>.lua for each kind.
func loadHealthScripts(dir string) (map[string]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.lua"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no health scripts (*.lua) in %s", dir)
	}
	scripts := make(map[string]string, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		scripts[strings.TrimSuffix(filepath.Base(p), ".lua")] = string(b)
	}
	return scripts, nil
}

// argoHealth runs the kind's script with `obj` set, as Argo CD does, and checks the
// returned table the way Argo CD reads it (status from the valid set, message).
func argoHealth(scripts map[string]string, obj map[string]any) Verdict {
	kind, _ := obj["kind"].(string)
	script, ok := scripts[kind]
	if !ok {
		return Verdict{Status: "error", Message: "no health script for kind " + kind}
	}
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	// Argo CD gives scripts the base, table, string and math libraries (and a few
	// safe os functions): open no more, so a script that works here works there.
	for _, lib := range []struct {
		name string
		fn   lua.LGFunction
	}{
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.StringLibName, lua.OpenString},
		{lua.MathLibName, lua.OpenMath},
	} {
		L.Push(L.NewFunction(lib.fn))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		return Verdict{Status: "error", Message: err.Error()}
	}
	ret, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		return Verdict{Status: "error", Message: "the script returned no table"}
	}
	status := lua.LVAsString(ret.RawGetString("status"))
	message := lua.LVAsString(ret.RawGetString("message"))
	if !argoStatuses[status] {
		return Verdict{Status: "error", Message: fmt.Sprintf("invalid health status %q", status)}
	}
	return Verdict{Status: status, Message: message}
}

// toLua converts decoded JSON into Lua values: objects and arrays become tables
// (arrays 1-based), as Argo CD hands the object to its scripts.
func toLua(L *lua.LState, v any) lua.LValue {
	switch t := v.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(t)
	case string:
		return lua.LString(t)
	case int64:
		return lua.LNumber(t)
	case float64:
		return lua.LNumber(t)
	case []any:
		tbl := L.NewTable()
		for _, e := range t {
			tbl.Append(toLua(L, e))
		}
		return tbl
	case map[string]any:
		tbl := L.NewTable()
		for k, e := range t {
			tbl.RawSetString(k, toLua(L, e))
		}
		return tbl
	default:
		return lua.LString(fmt.Sprint(t))
	}
}

// runArgoCDConfigMap prints the argocd-cm data users paste: one
// resource.customizations.health.<group>_<Kind> key per script.
func runArgoCDConfigMap(args []string, out *os.File) error {
	dir := ""
	for i := 0; i < len(args); i++ {
		if args[i] == "--argocd" && i+1 < len(args) {
			dir = args[i+1]
			i++
		}
	}
	if dir == "" {
		return fmt.Errorf("argocd-cm needs --argocd DIR")
	}
	scripts, err := loadHealthScripts(dir)
	if err != nil {
		return err
	}
	_, err = out.WriteString(argoCDConfigMap(scripts))
	return err
}

func argoCDConfigMap(scripts map[string]string) string {
	kinds := make([]string, 0, len(scripts))
	for k := range scripts {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var b strings.Builder
	b.WriteString("# Generated from deploy/gitops/argocd/health/*.lua by `e2e/gitops` (tests/gitops.rs\n")
	b.WriteString("# fails when it drifts). Merge into your argocd-cm ConfigMap.\n")
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argocd-cm\n  namespace: argocd\n")
	b.WriteString("  labels:\n    app.kubernetes.io/name: argocd-cm\n    app.kubernetes.io/part-of: argocd\ndata:\n")
	for _, k := range kinds {
		fmt.Fprintf(&b, "  resource.customizations.health.%s_%s: |\n", group, k)
		for _, line := range strings.Split(strings.TrimRight(scripts[k], "\n"), "\n") {
			if line == "" {
				b.WriteString("\n")
			} else {
				b.WriteString("    " + line + "\n")
			}
		}
	}
	return b.String()
}
