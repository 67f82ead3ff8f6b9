module harness-engine.dev/e2e/images/pause

go 1.26.0
