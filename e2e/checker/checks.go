package main

import (
	"fmt"
	"sort"
)

// Finding is one violation found by a direct check, named by its class.
type Finding struct {
	Class  string `json:"class"`
	Part   string `json:"part"`
	Op     int    `json:"op"`
	Detail string `json:"detail"`
}

// fenceAt is a fence value some acknowledged operation established, and when that
// acknowledgement arrived.
type fenceAt struct {
	epoch, gen uint64
	ret        int64
	op         int
	clear      bool
}

func less(e1, g1, e2, g2 uint64) bool { return e1 < e2 || (e1 == e2 && g1 < g2) }

// StaleAcceptances finds operations the store admitted under a fence that an
// acknowledged fence raise or clear had already replaced before the operation was even
// invoked. The fence only moves forward ((epoch, generation), lexicographically) and an
// admitted call must present exactly the current fence, so each of these is a worker
// that was replaced yet still wrote (or read) state.
func StaleAcceptances(ops []Op) []Finding {
	raised := map[string][]fenceAt{}
	for _, op := range ops {
		if op.Out.Status != "ok" {
			continue
		}
		switch op.F {
		case "fence":
			raised[op.Part] = append(raised[op.Part], fenceAt{op.In.Epoch, op.In.Gen, op.Ret, op.ID, false})
		case "clear":
			raised[op.Part] = append(raised[op.Part], fenceAt{op.In.Epoch, 0, op.Ret, op.ID, true})
		}
	}
	var out []Finding
	for _, op := range ops {
		if op.Out.Status != "ok" {
			continue
		}
		switch op.F {
		case "head", "commit", "oput", "oget":
		default:
			continue
		}
		for _, f := range raised[op.Part] {
			if f.ret >= op.Call || !less(op.In.Epoch, op.In.Gen, f.epoch, f.gen) {
				continue
			}
			class, what := "stale_generation", fmt.Sprintf("lease generation %d after fence (%d,%d) was acknowledged by op %d", op.In.Gen, f.epoch, f.gen, f.op)
			if op.In.Epoch < f.epoch {
				class, what = "stale_epoch", fmt.Sprintf("epoch %d after the clear to epoch %d was acknowledged by op %d", op.In.Epoch, f.epoch, f.op)
			}
			verb := "admitted"
			if isWrite(op.F) {
				verb = "accepted a write"
			}
			out = append(out, Finding{class, op.Part, op.ID, fmt.Sprintf("%s %s at %s", op.F, verb, what)})
			break
		}
	}
	return out
}

// ack is an acknowledged write: the value a later read must show at least.
type ack struct {
	epoch uint64
	key   string
	rev   uint64
	ret   int64
	op    int
}

// LostWrites finds acknowledged writes that a later read (invoked after the write was
// acknowledged) no longer shows: a head read at a lower revision in the same epoch, an
// object read at a lower version (or not found) in the same epoch, a memory read at a
// lower revision (or not found). A read admitted in an epoch proves no clear happened in
// between (the epoch only moves forward), so within an epoch nothing may go backwards.
func LostWrites(ops []Op) []Finding {
	acks := map[string][]ack{}
	keyOf := func(op Op) string {
		switch op.F {
		case "commit", "head":
			return "head"
		default:
			return op.In.Key
		}
	}
	for _, op := range ops {
		if op.Out.Status != "ok" {
			continue
		}
		switch op.F {
		case "commit", "oput", "mput":
			acks[op.Part] = append(acks[op.Part], ack{op.In.Epoch, keyOf(op), op.Out.Rev, op.Ret, op.ID})
		}
	}
	for _, list := range acks {
		sort.Slice(list, func(i, j int) bool { return list[i].ret < list[j].ret })
	}
	var out []Finding
	for _, op := range ops {
		var seen uint64
		switch {
		case op.Out.Status == "ok":
			seen = op.Out.Rev
		case op.Out.Status == "fail" && op.Out.Code == "not_found":
			seen = 0
		default:
			continue
		}
		sameEpoch := true
		switch op.F {
		case "head", "oget":
		case "mget":
			sameEpoch = false
		default:
			continue
		}
		key := keyOf(op)
		for _, a := range acks[op.Part] {
			if a.ret >= op.Call {
				break
			}
			if a.key != key || (sameEpoch && a.epoch != op.In.Epoch) || seen >= a.rev {
				continue
			}
			out = append(out, Finding{"lost_write", op.Part, op.ID,
				fmt.Sprintf("%s of %s saw revision %d after op %d was acknowledged at revision %d", op.F, key, seen, a.op, a.rev)})
			break
		}
	}
	return out
}
