package outbox_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
)

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// The verification snippet merchants copy (docs/webhooks.md) compiles and agrees with
// kasa's signer: a good signature passes, another secret, a changed body and an old timestamp fail.
func TestMerchantSnippetsVerifyKasaSignatures(t *testing.T) {
	t.Parallel()
	secret, body := "whsec_snippet", []byte(`{"id":"evt","type":"payment.succeeded","data":{"amount":"10.00"}}`)
	good := outbox.Sign(secret, time.Now(), body)
	old := outbox.Sign(secret, time.Now().Add(-time.Hour), body)
	rotated := outbox.Sign("whsec_new", time.Now(), body, secret) // during a rotation: both sign
	check := fmt.Sprintf(`package main

import (
	"testing"
	"time"
)

func TestSnippet(t *testing.T) {
	body := []byte(%q)
	if err := verifyKasaSignature(%q, %q, body, 5*time.Minute); err != nil {
		t.Fatalf("a good signature: %%v", err)
	}
	for _, s := range []string{%q, "whsec_new"} {
		if err := verifyKasaSignature(s, %q, body, 5*time.Minute); err != nil {
			t.Fatalf("rotated, with %%s: %%v", s, err)
		}
		if err := verifyWithAny([]string{"whsec_other", s}, %q, body, 5*time.Minute); err != nil {
			t.Fatalf("rotated, any of two with %%s: %%v", s, err)
		}
	}
	if verifyWithAny([]string{"whsec_other"}, %q, body, 5*time.Minute) == nil {
		t.Errorf("rotated, another secret: accepted")
	}
	for name, err := range map[string]error{
		"another secret": verifyKasaSignature("whsec_other", %q, body, 5*time.Minute),
		"changed body":   verifyKasaSignature(%q, %q, append(body, ' '), 5*time.Minute),
		"old timestamp":  verifyKasaSignature(%q, %q, body, 5*time.Minute),
		"malformed":      verifyKasaSignature(%q, "v1=00", body, 5*time.Minute),
	} {
		if err == nil {
			t.Errorf("%%s: accepted", name)
		}
	}
}
`, body, secret, good, secret, rotated, rotated, rotated, good, secret, good, secret, old, secret)

	for _, doc := range []string{"../docs/webhooks.md"} {
		t.Run(filepath.Base(doc), func(t *testing.T) {
			t.Parallel()
			text, err := os.ReadFile(doc)
			require.NoError(t, err)
			var snippet string
			for _, m := range goBlock.FindAllStringSubmatch(string(text), -1) {
				if regexp.MustCompile(`func verifyKasaSignature\(`).MatchString(m[1]) {
					snippet = m[1]
				}
			}
			require.NotEmpty(t, snippet, "%s shows merchants verifyKasaSignature", doc)
			if !regexp.MustCompile(`(?m)^func main\(\)`).MatchString(snippet) {
				snippet += "\nfunc main() {}\n"
			}
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module snippet\n\ngo 1.26\n"), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(snippet), 0o644))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "main_test.go"), []byte(check), 0o644))
			cmd := exec.Command("go", "test", "-count=1", ".")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s's snippet:\n%s", doc, out)
		})
	}
}
