// Command checker verifies a history recorded by the chaos workload (tests/chaos.rs).
//
//	checker [-timeout 120s] [-viz DIR] HISTORY.jsonl
//
// It checks every partition (one binding: its fence, head and objects; or one memory
// record) for linearizability with porcupine against the model in model.go, and runs
// two direct checks that name the classes of violation the store must never show: an
// acknowledged write lost, an operation admitted under a fence an acknowledged raise or
// clear had replaced. It prints a JSON summary on stdout and a short one on stderr; on a
// violation it writes porcupine's visualization of each failing partition into -viz.
//
// Exit status: 0 pass, 1 a violation, 2 inconclusive (a partition timed out), 3 bad input.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Summary is what the checker prints.
type Summary struct {
	Verdict      string                    `json:"verdict"`
	Reasons      []string                  `json:"reasons"`
	Ops          int                       `json:"ops"`
	Partitions   int                       `json:"partitions"`
	ByStatus     map[string]int            `json:"by_status"`
	ByOp         map[string]map[string]int `json:"by_op"`
	Linearizable string                    `json:"linearizable"`
	Illegal      []string                  `json:"illegal_partitions"`
	TimedOut     []string                  `json:"timed_out_partitions"`
	LostWrites   []Finding                 `json:"lost_writes"`
	Stale        []Finding                 `json:"stale_acceptances"`
	Unexpected   map[string]int            `json:"unexpected_codes"`
	Visualized   []string                  `json:"visualizations,omitempty"`
	CheckSeconds float64                   `json:"check_seconds"`
}

// Expected refusal codes: what the model can explain. Anything else is reported.
var expectedCodes = map[string]bool{
	"stale_epoch": true, "stale_lease": true, "revision_conflict": true, "conflict": true,
	"not_found": true, "invalid": true, "rate_limited": true, "unreachable": true,
}

func readHistory(r io.Reader) ([]Op, error) {
	var ops []Op
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var op Op
		if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if op.Part == "" || op.F == "" {
			return nil, fmt.Errorf("line %d: an operation needs part and f", line)
		}
		switch op.Out.Status {
		case "ok", "fail", "unknown":
		default:
			return nil, fmt.Errorf("line %d: status %q is not ok, fail or unknown", line, op.Out.Status)
		}
		if op.Ret < op.Call {
			return nil, fmt.Errorf("line %d: returns (%d) before its call (%d)", line, op.Ret, op.Call)
		}
		ops = append(ops, op)
	}
	return ops, sc.Err()
}

func partitions(ops []Op) (names []string, parts map[string][]porcupine.Operation) {
	parts = map[string][]porcupine.Operation{}
	for _, op := range ops {
		if _, ok := parts[op.Part]; !ok {
			names = append(names, op.Part)
		}
		parts[op.Part] = append(parts[op.Part], porcupine.Operation{
			ClientId: op.Client, Input: op, Call: op.Call, Output: op.Out, Return: op.Ret,
		})
	}
	sort.Strings(names)
	return names, parts
}

// Check runs every check on a history.
func Check(ops []Op, timeout time.Duration, vizDir string) Summary {
	started := time.Now()
	s := Summary{
		Ops: len(ops), ByStatus: map[string]int{}, ByOp: map[string]map[string]int{},
		Unexpected: map[string]int{}, Linearizable: "ok",
		Illegal: []string{}, TimedOut: []string{}, Reasons: []string{},
	}
	for _, op := range ops {
		s.ByStatus[op.Out.Status]++
		if s.ByOp[op.F] == nil {
			s.ByOp[op.F] = map[string]int{}
		}
		key := op.Out.Status
		if op.Out.Status == "fail" {
			key = "fail:" + op.Out.Code
			if !expectedCodes[op.Out.Code] {
				s.Unexpected[op.Out.Code]++
			}
		}
		s.ByOp[op.F][key]++
	}
	model := Model()
	names, parts := partitions(ops)
	s.Partitions = len(names)
	for _, name := range names {
		res, info := porcupine.CheckOperationsVerbose(model, parts[name], timeout)
		switch res {
		case porcupine.Illegal:
			s.Illegal = append(s.Illegal, name)
			if vizDir != "" {
				path := filepath.Join(vizDir, "partition-"+name+".html")
				if err := porcupine.VisualizePath(model, info, path); err == nil {
					s.Visualized = append(s.Visualized, path)
				}
			}
		case porcupine.Unknown:
			s.TimedOut = append(s.TimedOut, name)
		}
	}
	s.LostWrites = nonNil(LostWrites(ops))
	s.Stale = nonNil(StaleAcceptances(ops))
	switch {
	case len(s.Illegal) > 0:
		s.Linearizable = "illegal"
	case len(s.TimedOut) > 0:
		s.Linearizable = "unknown"
	}
	if len(s.Illegal) > 0 {
		s.Reasons = append(s.Reasons, fmt.Sprintf("not linearizable: partitions %v", s.Illegal))
	}
	if n := len(s.LostWrites); n > 0 {
		s.Reasons = append(s.Reasons, fmt.Sprintf("%d acknowledged writes lost", n))
	}
	if n := len(s.Stale); n > 0 {
		s.Reasons = append(s.Reasons, fmt.Sprintf("%d operations admitted at a stale generation or epoch", n))
	}
	if len(s.Unexpected) > 0 {
		s.Reasons = append(s.Reasons, fmt.Sprintf("unexpected refusal codes %v", s.Unexpected))
	}
	switch {
	case len(s.Reasons) > 0:
		s.Verdict = "fail"
	case len(s.TimedOut) > 0:
		s.Verdict = "inconclusive"
		s.Reasons = append(s.Reasons, fmt.Sprintf("the check timed out on partitions %v", s.TimedOut))
	default:
		s.Verdict = "pass"
	}
	s.CheckSeconds = time.Since(started).Seconds()
	return s
}

func nonNil(f []Finding) []Finding {
	if f == nil {
		return []Finding{}
	}
	return f
}

func main() {
	timeout := flag.Duration("timeout", 120*time.Second, "time limit per partition (0: none)")
	vizDir := flag.String("viz", "", "directory for visualizations of failing partitions")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: checker [-timeout D] [-viz DIR] HISTORY.jsonl")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(3)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "checker:", err)
		os.Exit(3)
	}
	ops, err := readHistory(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "checker: %s: %v\n", flag.Arg(0), err)
		os.Exit(3)
	}
	s := Check(ops, *timeout, *vizDir)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s)
	fmt.Fprintf(os.Stderr, "checker: %d operations in %d partitions (%v): %s", s.Ops, s.Partitions, s.ByStatus, s.Verdict)
	for _, r := range s.Reasons {
		fmt.Fprintf(os.Stderr, "; %s", r)
	}
	fmt.Fprintln(os.Stderr)
	switch s.Verdict {
	case "pass":
		os.Exit(0)
	case "inconclusive":
		os.Exit(2)
	default:
		os.Exit(1)
	}
}
