package main

import (
	"testing"
	"time"
)

func op(id int, part, f string, in Input, out Output, call, ret int64) Op {
	return Op{ID: id, Client: id, Part: part, F: f, In: in, Out: out, Call: call, Ret: ret}
}

var ok = func(rev uint64, val string) Output { return Output{Status: "ok", Rev: rev, Val: val} }

func fail(code string) Output { return Output{Status: "fail", Code: code} }

func unknown() Output { return Output{Status: "unknown", Error: "timed out"} }

func check(t *testing.T, ops []Op) Summary {
	t.Helper()
	return Check(ops, 10*time.Second, "")
}

func TestAGoodHistoryPasses(t *testing.T) {
	s := check(t, []Op{
		op(0, "b0", "head", Input{Gen: 1}, ok(0, ""), 0, 10),
		op(1, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r1"}, ok(1, "r1"), 20, 30),
		op(2, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r2"}, fail("revision_conflict"), 25, 40),
		op(3, "b0", "fence", Input{Gen: 2}, Output{Status: "ok", Gen: 2}, 50, 60),
		op(4, "b0", "commit", Input{Gen: 1, Expect: 1, Val: "r3"}, fail("stale_lease"), 70, 80),
		op(5, "b0", "commit", Input{Gen: 2, Expect: 1, Val: "r4"}, ok(2, "r4"), 70, 90),
		op(6, "b0", "oput", Input{Gen: 2, Key: "o1", Mode: "create", Val: "x"}, ok(1, ""), 100, 110),
		op(7, "b0", "oget", Input{Gen: 2, Key: "o1"}, ok(1, "x"), 120, 130),
		op(8, "b0", "clear", Input{Epoch: 1}, Output{Status: "ok", Epoch: 1}, 140, 150),
		op(9, "b0", "oget", Input{Epoch: 1, Gen: 2, Key: "o1"}, fail("not_found"), 160, 170),
		op(10, "b0", "head", Input{Epoch: 1, Gen: 2}, ok(0, ""), 160, 170),
		op(11, "m0", "mput", Input{Key: "k", Val: "a"}, ok(1, ""), 0, 10),
		op(12, "m0", "mput", Input{Key: "k", Expect: 0, Val: "b"}, fail("revision_conflict"), 20, 30),
		op(13, "m0", "mget", Input{Key: "k"}, ok(1, "a"), 40, 50),
	})
	if s.Verdict != "pass" {
		t.Fatalf("verdict %s: %v", s.Verdict, s.Reasons)
	}
}

// The deliberate bug: a store that acknowledges a commit and then loses it.
func TestALostAcknowledgedWriteIsRejected(t *testing.T) {
	s := check(t, []Op{
		op(0, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r1"}, ok(1, "r1"), 0, 10),
		op(1, "b0", "head", Input{Gen: 1}, ok(0, ""), 20, 30),
	})
	if s.Verdict != "fail" || s.Linearizable != "illegal" || len(s.LostWrites) != 1 {
		t.Fatalf("a lost commit passed: %+v", s)
	}
	s = check(t, []Op{
		op(0, "b0", "oput", Input{Gen: 1, Key: "o0", Mode: "upsert", Val: "x"}, ok(1, ""), 0, 10),
		op(1, "b0", "oget", Input{Gen: 1, Key: "o0"}, fail("not_found"), 20, 30),
	})
	if s.Verdict != "fail" || len(s.LostWrites) != 1 {
		t.Fatalf("a lost object put passed: %+v", s)
	}
	s = check(t, []Op{
		op(0, "m0", "mput", Input{Key: "k", Val: "a"}, ok(1, ""), 0, 10),
		op(1, "m0", "mput", Input{Key: "k", Expect: 1, Val: "b"}, ok(2, ""), 20, 30),
		op(2, "m0", "mget", Input{Key: "k"}, ok(1, "a"), 40, 50),
	})
	if s.Verdict != "fail" || len(s.LostWrites) != 1 {
		t.Fatalf("a lost memory write passed: %+v", s)
	}
}

// The deliberate bug: a store that admits a write from a replaced worker.
func TestAStaleGenerationAcceptanceIsRejected(t *testing.T) {
	s := check(t, []Op{
		op(0, "b0", "fence", Input{Gen: 2}, Output{Status: "ok", Gen: 2}, 0, 10),
		op(1, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r1"}, ok(1, "r1"), 20, 30),
	})
	if s.Verdict != "fail" || s.Linearizable != "illegal" || len(s.Stale) != 1 || s.Stale[0].Class != "stale_generation" {
		t.Fatalf("a stale-generation commit passed: %+v", s)
	}
	s = check(t, []Op{
		op(0, "b0", "clear", Input{Epoch: 1}, Output{Status: "ok", Epoch: 1}, 0, 10),
		op(1, "b0", "oput", Input{Gen: 1, Key: "o0", Mode: "upsert", Val: "x"}, ok(1, ""), 20, 30),
	})
	if s.Verdict != "fail" || len(s.Stale) != 1 || s.Stale[0].Class != "stale_epoch" {
		t.Fatalf("a stale-epoch put passed: %+v", s)
	}
}

// Unknown outcomes may or may not take effect, but not both, and not after their bound.
func TestUnknownOutcomes(t *testing.T) {
	s := check(t, []Op{
		op(0, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r1"}, unknown(), 0, 100),
		op(1, "b0", "head", Input{Gen: 1}, ok(0, ""), 10, 20),
		op(2, "b0", "head", Input{Gen: 1}, ok(1, "r1"), 50, 60),
		op(3, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r2"}, unknown(), 200, 300),
		op(4, "b0", "head", Input{Gen: 1}, ok(1, "r1"), 400, 410),
	})
	if s.Verdict != "pass" {
		t.Fatalf("verdict %s: %v", s.Verdict, s.Reasons)
	}
	s = check(t, []Op{
		op(0, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r1"}, unknown(), 0, 100),
		op(1, "b0", "head", Input{Gen: 1}, ok(1, "r1"), 10, 20),
		op(2, "b0", "head", Input{Gen: 1}, ok(0, ""), 50, 60),
	})
	if s.Verdict != "fail" {
		t.Fatalf("an unknown commit seen and then unseen passed: %+v", s)
	}
	s = check(t, []Op{
		op(0, "b0", "commit", Input{Gen: 1, Expect: 0, Val: "r1"}, unknown(), 0, 100),
		op(1, "b0", "head", Input{Gen: 1}, ok(0, ""), 110, 120),
		op(2, "b0", "head", Input{Gen: 1}, ok(1, "r1"), 150, 160),
	})
	if s.Verdict != "fail" {
		t.Fatalf("an unknown commit taking effect after its bound passed: %+v", s)
	}
}
