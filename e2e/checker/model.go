package main

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Op is one recorded invocation and its response, one JSON object per line of the
// history file that tests/chaos.rs writes.
//
// Times are nanoseconds since the start of the run. For an operation whose outcome is
// unknown (the request failed after it may have reached the server), Ret is the latest
// time its effect can have happened, as the recorder bounds it; porcupine may place the
// operation anywhere in [Call, Ret], or let it have no effect.
type Op struct {
	ID     int    `json:"id"`
	Client int    `json:"client"`
	Part   string `json:"part"`
	F      string `json:"f"`
	In     Input  `json:"in"`
	Out    Output `json:"out"`
	Call   int64  `json:"call"`
	Ret    int64  `json:"ret"`
}

// Input of an operation. Which fields matter depends on F:
//
//	fence  Epoch, Gen: raise the binding's fence to (Epoch, Gen)
//	clear  Epoch: move the binding to epoch Epoch (current + 1), deleting its state
//	head   Epoch, Gen: load the durable head under that fence
//	commit Epoch, Gen, Expect (revision), Val (run id): write and commit a new head
//	oput   Epoch, Gen, Key, Mode (create|replace|upsert), Expect (version), Val (body)
//	oget   Epoch, Gen, Key
//	mput   Key, Expect (revision, 0: create), Val (content)
//	mget   Key
type Input struct {
	Epoch  uint64 `json:"epoch"`
	Gen    uint64 `json:"gen"`
	Expect uint64 `json:"expect"`
	Key    string `json:"key,omitempty"`
	Mode   string `json:"mode,omitempty"`
	Val    string `json:"val,omitempty"`
}

// Output of an operation: Status is ok, fail (a definite refusal, with its code) or
// unknown. Rev is the head revision, object version or memory revision an ok answer
// carried; Val the head's run id, the object's body or the memory's content.
type Output struct {
	Status string `json:"status"`
	Code   string `json:"code,omitempty"`
	Rev    uint64 `json:"rev"`
	Val    string `json:"val,omitempty"`
	Epoch  uint64 `json:"epoch"`
	Gen    uint64 `json:"gen"`
	// What went wrong, for an unknown outcome (not used by the model).
	Error string `json:"error,omitempty"`
}

// MaxObjectKeys bounds the object keys per binding the model tracks (o0 .. o7).
const MaxObjectKeys = 8

// Obj is one native object: version 0 is absent.
type Obj struct {
	Ver uint64
	Val string
}

// State is the model of one partition: a binding (its fence, its durable head as a
// compare-and-set register, its objects) or one memory record. Plain values only, so
// states compare with ==.
type State struct {
	Epoch, Gen, Rev uint64
	Run             string
	Objs            [MaxObjectKeys]Obj
	MRev            uint64
	MVal            string
}

// InitialState is a binding just created (epoch 0, lease generation 1, no head) and an
// absent memory record.
func InitialState() State { return State{Epoch: 0, Gen: 1} }

func objIndex(key string) (int, bool) {
	if !strings.HasPrefix(key, "o") {
		return 0, false
	}
	i, err := strconv.Atoi(key[1:])
	if err != nil || i < 0 || i >= MaxObjectKeys {
		return 0, false
	}
	return i, true
}

// spec is the sequential specification: what the system does with `op` in state `s`.
// It returns the next state and the expected answer when the operation is admitted, and
// the codes a refusal may carry when it is not (every violated rule's code; the stores
// check the fence first, but the model does not depend on the order).
func spec(s State, op Op) (next State, want Output, refusals []string) {
	in := op.In
	next = s
	fence := func() []string {
		if in.Epoch != s.Epoch {
			return []string{"stale_epoch"}
		}
		if in.Gen != s.Gen {
			return []string{"stale_lease"}
		}
		return nil
	}
	switch op.F {
	case "fence":
		switch {
		case in.Epoch < s.Epoch:
			refusals = append(refusals, "stale_epoch")
		case in.Epoch > s.Epoch:
			refusals = append(refusals, "invalid")
		case in.Gen < s.Gen:
			refusals = append(refusals, "stale_lease")
		}
		if refusals == nil {
			next.Gen = in.Gen
			want = Output{Status: "ok", Epoch: in.Epoch, Gen: in.Gen}
		}
	case "clear":
		switch {
		case in.Epoch < s.Epoch:
			refusals = append(refusals, "stale_epoch")
		case in.Epoch > s.Epoch+1:
			refusals = append(refusals, "invalid")
		}
		if refusals == nil {
			if in.Epoch == s.Epoch+1 {
				// A new epoch: the head and the objects are gone; the generation stays.
				next = State{Epoch: in.Epoch, Gen: s.Gen, MRev: s.MRev, MVal: s.MVal}
			}
			want = Output{Status: "ok", Epoch: in.Epoch}
		}
	case "head":
		refusals = fence()
		want = Output{Status: "ok", Rev: s.Rev, Val: s.Run}
	case "commit":
		refusals = fence()
		if s.Rev != in.Expect {
			refusals = append(refusals, "revision_conflict")
		}
		next.Rev = s.Rev + 1
		next.Run = in.Val
		want = Output{Status: "ok", Rev: next.Rev, Val: in.Val}
	case "oput", "oget":
		refusals = fence()
		i, ok := objIndex(in.Key)
		if !ok {
			return s, Output{}, []string{"model: unknown object key " + in.Key}
		}
		cur := s.Objs[i]
		if op.F == "oget" {
			if cur.Ver == 0 {
				refusals = append(refusals, "not_found")
			}
			want = Output{Status: "ok", Rev: cur.Ver, Val: cur.Val}
			break
		}
		switch in.Mode {
		case "create":
			if cur.Ver != 0 && cur.Val != in.Val {
				refusals = append(refusals, "conflict")
			}
			if cur.Ver != 0 && cur.Val == in.Val {
				// An identical body under the key: an idempotent retry.
				want = Output{Status: "ok", Rev: cur.Ver}
				return next, want, refusals
			}
		case "replace":
			if cur.Ver != in.Expect {
				refusals = append(refusals, "conflict")
			}
		case "upsert":
		default:
			return s, Output{}, []string{"model: unknown put mode " + in.Mode}
		}
		next.Objs[i] = Obj{Ver: cur.Ver + 1, Val: in.Val}
		want = Output{Status: "ok", Rev: cur.Ver + 1}
	case "mput":
		if (s.MRev == 0 && in.Expect != 0) || (s.MRev != 0 && in.Expect != s.MRev) {
			refusals = append(refusals, "revision_conflict")
		}
		next.MRev = s.MRev + 1
		next.MVal = in.Val
		want = Output{Status: "ok", Rev: next.MRev}
	case "mget":
		if s.MRev == 0 {
			refusals = append(refusals, "not_found")
		}
		want = Output{Status: "ok", Rev: s.MRev, Val: s.MVal}
	default:
		return s, Output{}, []string{"model: unknown operation " + op.F}
	}
	return next, want, refusals
}

// matches says whether an ok answer is the one the specification expects.
func matches(f string, got, want Output) bool {
	switch f {
	case "fence", "clear":
		return got.Epoch == want.Epoch && (f == "clear" || got.Gen == want.Gen)
	case "oput", "mput":
		return got.Rev == want.Rev
	default:
		return got.Rev == want.Rev && got.Val == want.Val
	}
}

// AlwaysAllowed are refusals that are legal in any state and change nothing: the
// per-binding write rate limit, and a connection the server's address refused (the
// request never reached a server: the recorder marks only a refused connect so).
var AlwaysAllowed = map[string]bool{"rate_limited": true, "unreachable": true}

func isWrite(f string) bool {
	switch f {
	case "fence", "clear", "commit", "oput", "mput":
		return true
	}
	return false
}

// Step is the nondeterministic step: the states the system can be in after `op` with
// answer `out`. An unknown outcome may have taken effect or not.
func Step(s State, op Op, out Output) []State {
	next, want, refusals := spec(s, op)
	switch out.Status {
	case "unknown":
		if refusals == nil && isWrite(op.F) {
			if next == s {
				return []State{s}
			}
			return []State{s, next}
		}
		return []State{s}
	case "ok":
		if refusals == nil && matches(op.F, out, want) {
			return []State{next}
		}
		return nil
	case "fail":
		if AlwaysAllowed[out.Code] {
			return []State{s}
		}
		for _, r := range refusals {
			if r == out.Code {
				return []State{s}
			}
		}
		return nil
	}
	return nil
}

func hashState(s State) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d/%s/%d/%s", s.Epoch, s.Gen, s.Rev, s.Run, s.MRev, s.MVal)
	for _, o := range s.Objs {
		fmt.Fprintf(h, "/%d:%s", o.Ver, o.Val)
	}
	return h.Sum64()
}

func describeOp(op Op, out Output) string {
	var b strings.Builder
	in := op.In
	switch op.F {
	case "fence":
		fmt.Fprintf(&b, "fence(%d,%d)", in.Epoch, in.Gen)
	case "clear":
		fmt.Fprintf(&b, "clear(->%d)", in.Epoch)
	case "head":
		fmt.Fprintf(&b, "head@(%d,%d)", in.Epoch, in.Gen)
	case "commit":
		fmt.Fprintf(&b, "commit@(%d,%d) expect %d run %s", in.Epoch, in.Gen, in.Expect, in.Val)
	case "oput":
		fmt.Fprintf(&b, "put@(%d,%d) %s %s expect %d val %s", in.Epoch, in.Gen, in.Key, in.Mode, in.Expect, in.Val)
	case "oget":
		fmt.Fprintf(&b, "get@(%d,%d) %s", in.Epoch, in.Gen, in.Key)
	case "mput":
		fmt.Fprintf(&b, "mput %s expect %d val %s", in.Key, in.Expect, in.Val)
	case "mget":
		fmt.Fprintf(&b, "mget %s", in.Key)
	default:
		b.WriteString(op.F)
	}
	switch out.Status {
	case "ok":
		switch op.F {
		case "fence", "clear":
			fmt.Fprintf(&b, " -> ok (%d,%d)", out.Epoch, out.Gen)
		case "oput", "mput":
			fmt.Fprintf(&b, " -> ok v%d", out.Rev)
		default:
			fmt.Fprintf(&b, " -> ok v%d %s", out.Rev, out.Val)
		}
	case "fail":
		fmt.Fprintf(&b, " -> %s", out.Code)
	default:
		fmt.Fprintf(&b, " -> unknown (%s)", out.Error)
	}
	return b.String()
}

func describeState(s State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "fence (%d,%d) head v%d %s", s.Epoch, s.Gen, s.Rev, s.Run)
	for i, o := range s.Objs {
		if o.Ver != 0 {
			fmt.Fprintf(&b, " o%d=v%d:%s", i, o.Ver, o.Val)
		}
	}
	if s.MRev != 0 {
		fmt.Fprintf(&b, " mem v%d:%s", s.MRev, s.MVal)
	}
	return b.String()
}

// Model is the porcupine model of one partition (one binding, or one memory record).
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{InitialState()} },
		Step: func(state, input, output interface{}) []interface{} {
			states := Step(state.(State), input.(Op), output.(Output))
			res := make([]interface{}, len(states))
			for i, s := range states {
				res[i] = s
			}
			return res
		},
		Equal: func(a, b interface{}) bool { return a.(State) == b.(State) },
		Hash:  func(s interface{}) uint64 { return hashState(s.(State)) },
		DescribeOperation: func(input, output interface{}) string {
			return describeOp(input.(Op), output.(Output))
		},
		DescribeState: func(s interface{}) string { return describeState(s.(State)) },
	}
	return nm.ToModel()
}
