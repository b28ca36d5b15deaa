//go:build !kasa_broken_split

package main

// claimPolicy says whether a worker claims its money settings before it polls. Only the
// deliberately broken build the soak's checker is tested against turns it off (docs/tools.md,
// "A broken build"): a compile-time constant, so no setting of a shipped binary can.
const claimPolicy = true
