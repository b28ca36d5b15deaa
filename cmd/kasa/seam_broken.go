//go:build kasa_broken_split

package main

// claimPolicy is off in this build: a worker with other money settings polls beside the others,
// the seam the soak's checker must catch (docs/tools.md, "A broken build"). Never shipped.
const claimPolicy = false
