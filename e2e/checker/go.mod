// The history checker of the chaos workload (tests/chaos.rs): reads a recorded history
// and checks it with porcupine against a model of each binding and memory record. Its own
// module, so adding it does not change the control plane's build key (e2e/go.mod).
module harness-engine.dev/e2e/checker

go 1.26.0

require github.com/anishathalye/porcupine v1.3.1
