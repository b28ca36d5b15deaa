package devenv

import "testing"

// Tests and tools in separate processes each take ports from FreePort and bind them later, in a
// child. A port given once must not be given again while its first taker may still be starting.
func TestFreePortGivesAPortOnce(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d given twice within %d picks, none of them bound", p, len(seen))
		}
		seen[p] = true
	}
}
