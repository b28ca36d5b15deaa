package outbox

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/kasa-pay/kasa/store"
)

// rebinding is a resolver whose DNS server answers every A question with 127.0.0.1 and every
// other question with nothing, as an attacker's name server would once a URL was registered.
func rebinding(t *testing.T) *net.Resolver {
	t.Helper()
	serve := func(c net.Conn) {
		defer c.Close()
		for {
			var n uint16
			if binary.Read(c, binary.BigEndian, &n) != nil {
				return
			}
			q := make([]byte, n)
			if _, err := io.ReadFull(c, q); err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(q) != nil || len(m.Questions) != 1 {
				return
			}
			m.Header.Response, m.Header.Authoritative, m.Header.RecursionAvailable = true, true, true
			if m.Questions[0].Type == dnsmessage.TypeA {
				m.Answers = []dnsmessage.Resource{{
					Header: dnsmessage.ResourceHeader{Name: m.Questions[0].Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1},
					Body:   &dnsmessage.AResource{A: [4]byte{127, 0, 0, 1}},
				}}
			}
			a, err := m.Pack()
			if err != nil {
				return
			}
			if binary.Write(c, binary.BigEndian, uint16(len(a))) != nil {
				return
			}
			if _, err := c.Write(a); err != nil {
				return
			}
		}
	}
	return &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe() // not a PacketConn: the resolver speaks DNS over a stream
		go serve(server)
		return client, nil
	}}
}

// A webhook URL whose name resolves to 127.0.0.1 when kasa dials it (a name accepted at
// registration can point anywhere later) is refused while private addresses are: nothing
// reaches the endpoint, and the delivery fails at once with the reason as its last error. So is
// a URL stored before the policy (a loopback name, credentials). With KASA_WEBHOOK_ALLOW_PRIVATE
// the rebinding name is delivered to.
func TestSenderRefusesAPrivateAddressAtDialTime(t *testing.T) {
	ctx := context.Background()
	const hint = "; webhooks go to public addresses only unless KASA_WEBHOOK_ALLOW_PRIVATE=true"
	for _, tc := range []struct {
		name, host   string // host replaces 127.0.0.1 in the endpoint's URL
		allowPrivate bool
		refusal      string   // the last error, after "refused: "; empty: delivered
		own          []string // KASA_WEBHOOK_OWN_HOSTS
	}{
		{"rebinding name", "hooks.merchant.test", false, "hooks.merchant.test:PORT resolved to 127.0.0.1, a loopback address" + hint, nil},
		{"rebinding name allowed", "hooks.merchant.test", true, "", nil},
		{"rebinding name to kasa itself", "hooks.merchant.test", true,
			"hooks.merchant.test:PORT resolved to 127.0.0.1, one of kasa's own addresses (KASA_WEBHOOK_OWN_HOSTS)", []string{"127.0.0.0/8"}},
		{"stored loopback name", "localhost", false, "webhook URL http://localhost:PORT/hooks must not point at a loopback address (localhost)" + hint, nil},
		{"stored credentials", "kasa:secret@hooks.merchant.test", true,
			"webhook URL http://kasa:xxxxx@hooks.merchant.test:PORT/hooks must not carry credentials (user:password@): authenticate kasa by the Kasa-Signature header", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A database of its own: the pipeline's metrics count this delivery's attempts alone.
			db := ownStore(t)
			b := newBroker(t)
			h := newHook(t, answer(http.StatusOK))
			_, port, err := net.SplitHostPort(strings.TrimPrefix(h.URL, "http://"))
			require.NoError(t, err)
			m := newMerchantIn(t, db, "http://"+tc.host+":"+port+"/hooks")
			p := startPipeline(t, b, pipelineOptions{relays: 1, refusePrivate: !tc.allowPrivate, sender: WebhookSenderOptions{resolver: rebinding(t), Own: NewOwnHosts(tc.own)}, store: db})
			pid := settleIn(t, db, m, false)

			require.Eventually(t, func() bool {
				ds, err := db.PaymentDeliveries(ctx, pid)
				return err == nil && len(ds) == 1 && ds[0].Status != store.DeliveryPending
			}, 10*time.Second, 20*time.Millisecond)
			time.Sleep(100 * time.Millisecond)
			ds, err := db.PaymentDeliveries(ctx, pid)
			require.NoError(t, err)
			d := ds[0]
			require.Len(t, d.Attempts, d.AttemptCount)
			// The test's name server runs in this process: on a loaded machine a lookup has
			// (rarely) failed before the first answer, and that attempt is retried as any
			// failed one is. What the policy decides is the last attempt; none before it may
			// have been refused, delivered or have reached the endpoint.
			last := d.Attempts[len(d.Attempts)-1]
			for _, a := range d.Attempts[:len(d.Attempts)-1] {
				t.Logf("attempt %d before the policy's: %q", a.Attempt, a.Error)
				require.Zero(t, a.StatusCode, "%+v", a)
				require.NotContains(t, a.Error, "refused", "%+v", a)
			}
			if tc.refusal == "" {
				require.Equal(t, store.DeliveryDelivered, d.Status, "%s", d.LastError)
				require.Equal(t, 1, h.Count())
				return
			}
			require.Zero(t, h.Count(), "nothing reaches the endpoint")
			require.Equal(t, store.DeliveryFailed, d.Status, "a refused address is not retried")
			require.Zero(t, last.StatusCode)
			require.Equal(t, "refused: "+strings.ReplaceAll(tc.refusal, "PORT", port), d.LastError)
			require.Equal(t, d.LastError, last.Error)
			require.Equal(t, 1.0, value(t, p.metrics.attempts.WithLabelValues("refused")))
			require.Equal(t, 1.0, value(t, p.metrics.deliveries.WithLabelValues("failed")))
		})
	}
}

// Every spelling of an address kasa must not call is refused at registration, public addresses
// and names are accepted, and credentials or a non-http scheme are refused under any policy.
func TestCheckWebhookURL(t *testing.T) {
	t.Parallel()
	const always = "always" // refused even with allowPrivate
	for _, tc := range []struct {
		url, refused string // refused: "" accepted, else a part of the reason
	}{
		// Accepted: public names and addresses, http and https.
		{"https://hooks.example.com/kasa", ""},
		{"http://hooks.example.com:8080/kasa?x=1", ""},
		{"https://HOOKS.Example.COM./kasa", ""},
		{"https://8.8.8.8/hook", ""},
		{"https://93.184.216.34:8443/", ""},
		{"https://[2606:4700:4700::1111]/hook", ""},
		{"https://[::ffff:8.8.8.8]/hook", ""},
		{"https://[64:ff9b::808:808]/", ""}, // NAT64 of 8.8.8.8
		{"http://172.32.0.1/", ""},
		{"http://100.63.255.255/", ""},
		{"http://100.128.0.1/", ""},
		{"http://192.169.0.1/", ""},
		{"http://11.0.0.1/", ""},
		{"http://localhost.example.com/", ""},
		{"https://hooks_1.example.com/kasa", ""}, // ASCII names are dialled as they are, not through IDNA
		{"https://-edge.example.com/kasa", ""},
		{"https://a--b.example.com/kasa", ""},
		// A port no connection can use.
		{"http://hooks.example.com:99999/x", always},
		{"http://hooks.example.com:0/x", always},
		{"https://hooks.example.com:65535/x", ""},
		// Not an http(s) URL.
		{"ftp://hooks.example.com/", always},
		{"hooks.example.com/kasa", always},
		{"//hooks.example.com/kasa", always},
		{"http:///kasa", always},
		{"http://", always},
		{"http:hooks.example.com", always},
		{"javascript:alert(1)", always},
		{"file:///etc/passwd", always},
		{"http://exa mple.com/", always},
		// Credentials.
		{"https://user:pass@hooks.example.com/", always},
		{"https://user@hooks.example.com/", always},
		{"https://:pass@hooks.example.com/", always},
		// Loopback in every spelling.
		{"http://127.0.0.1/", "loopback"},
		{"http://127.1.2.3:8080/", "loopback"},
		{"http://127.0.0.1./", "loopback"},
		{"http://[::1]/", "loopback"},
		{"http://[0:0:0:0:0:0:0:1]/", "loopback"},
		{"http://localhost/", "loopback"},
		{"http://LOCALHOST.:9000/", "loopback"},
		{"http://api.localhost/", "loopback"},
		{"http://[::ffff:127.0.0.1]/", "loopback"},
		{"http://[::ffff:7f00:1]/", "loopback"},
		{"http://2130706433/", "loopback"},
		{"http://0x7f000001/", "loopback"},
		{"http://017700000001/", "loopback"},
		{"http://127.1/", "loopback"},
		{"http://127.0.1/", "loopback"},
		{"http://0177.0.0.1/", "loopback"},
		{"http://0x7f.0.0.1/", "loopback"},
		{"http://[64:ff9b::7f00:1]/", "loopback"}, // NAT64 of 127.0.0.1
		{"http://[2002:7f00:1::]/", "loopback"},   // 6to4 of 127.0.0.1
		// Spellings the HTTP client maps to the above before it dials (IDNA).
		{"http://127\u30020\u30020\u30021/", "loopback"},                               // ideographic full stops
		{"http://\uff11\uff12\uff17.0.0.1/", "loopback"},                               // fullwidth digits
		{"http://\u24db\u24de\u24d2\u24d0\u24db\u24d7\u24de\u24e2\u24e3/", "loopback"}, // circled letters: localhost
		{"http://169.254.169.254\u3002/latest/meta-data/", "link-local"},
		{"https://b\u00fccher.example/hook", ""}, // a name of its own, in its IDNA form at dial time
		// Private.
		{"http://10.0.0.1/", "private"},
		{"http://10.255.255.255/", "private"},
		{"http://172.16.5.4/", "private"},
		{"http://172.31.255.255/", "private"},
		{"http://192.168.1.1/", "private"},
		{"http://3232235777/", "private"}, // 192.168.1.1
		{"http://[fd00::1]/", "private"},
		{"http://[fc00::1]/", "private"},
		{"http://[::ffff:10.0.0.1]/", "private"},
		{"http://[2002:a00:1::]/", "private"}, // 6to4 of 10.0.0.1
		// Link-local, including the cloud metadata address.
		{"http://169.254.169.254/latest/meta-data/", "link-local"},
		{"http://[fe80::1]/", "link-local"},
		{"http://[fe80::1%25eth0]/", "link-local"},
		{"http://[::ffff:169.254.169.254]/", "link-local"},
		// Unspecified.
		{"http://0.0.0.0/", "unspecified"},
		{"http://0/", "unspecified"},
		{"http://0.1.2.3/", "unspecified"},
		{"http://[::]/", "unspecified"},
		// Shared (CGNAT), multicast, broadcast, reserved.
		{"http://100.64.0.1/", "shared"},
		{"http://100.127.255.254/", "shared"},
		{"http://224.0.0.1/", "multicast"},
		{"http://[ff02::1]/", "multicast"},
		{"http://255.255.255.255/", "reserved"},
		{"http://240.0.0.1/", "reserved"},
		{"http://198.18.0.1/", "reserved"},
		{"http://192.0.2.1/", "reserved"},
		{"http://[2001:db8::1]/", "reserved"},
		{"http://[64:ff9b:1::a00:1]/", "local NAT64"},
		{"http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "Teredo"},
		{"http://[fec0::1]/", "site-local"},
		{"http://[::127.0.0.1]/", "reserved"}, // IPv4-compatible
		// A public address in a spelling parsers disagree on.
		{"http://134744072/", "usual form"}, // 8.8.8.8
		{"http://010.010.010.010/", "usual form"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			t.Parallel()
			err := CheckWebhookURL(tc.url, Policy{})
			if tc.refused == "" {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrWebhookURL)
				if tc.refused != always {
					require.Contains(t, err.Error(), tc.refused)
				}
			}
			err = CheckWebhookURL(tc.url, Policy{AllowPrivate: true})
			if tc.refused == always {
				require.ErrorIs(t, err, ErrWebhookURL, "refused whatever the policy")
			} else {
				require.NoError(t, err, "allowed with allowPrivate")
			}
		})
	}
	require.EqualError(t, CheckWebhookURL("http://2130706433/", Policy{}), "must not point at a loopback address (127.0.0.1)")
	require.EqualError(t, CheckWebhookURL("ftp://x", Policy{}), "must be an http(s) URL")
	require.EqualError(t, CheckWebhookURL("http://hooks.example.com:99999/x", Policy{AllowPrivate: true}), "must have a port from 1 to 65535")
}

// kasa's own public hosts (KASA_WEBHOOK_OWN_HOSTS) are refused under any policy, by name in any
// case, and by address in any network given; other public hosts are not.
func TestCheckWebhookURLRefusesKasaItself(t *testing.T) {
	t.Parallel()
	own := NewOwnHosts([]string{"api.kasa.example", "93.184.215.0/24", "2606:4700::1", " "})
	for _, tc := range []struct{ url, refused string }{
		{"https://api.kasa.example/hooks", "must not point at kasa itself (api.kasa.example)"},
		{"https://API.Kasa.Example./hooks", "must not point at kasa itself (api.kasa.example)"},
		{"https://93.184.215.14/hooks", "must not point at kasa itself (93.184.215.14)"},
		{"https://[::ffff:93.184.215.14]/hooks", "must not point at kasa itself (93.184.215.14)"},
		{"https://1572394766/hooks", "must not point at kasa itself (93.184.215.14)"},
		{"https://[2606:4700::1]:8443/hooks", "must not point at kasa itself (2606:4700::1)"},
		{"https://hooks.merchant.example/x", ""},
		{"https://kasa.example/x", ""},
		{"https://93.184.216.34/x", ""},
		// A NAT64 gateway or a 6to4 relay delivers to the IPv4 address these carry.
		{"https://[64:ff9b::5db8:d70e]/hooks", "must not point at kasa itself (64:ff9b::5db8:d70e)"},
		{"https://[2002:5db8:d70e::1]/hooks", "must not point at kasa itself (2002:5db8:d70e::1)"},
		{"https://[64:ff9b::5db8:d822]/x", ""},
	} {
		for _, private := range []bool{false, true} {
			err := CheckWebhookURL(tc.url, Policy{AllowPrivate: private, Own: own})
			if tc.refused == "" {
				require.NoError(t, err, tc.url)
				continue
			}
			require.ErrorIs(t, err, ErrWebhookURL, tc.url)
			require.EqualError(t, err, tc.refused, tc.url)
		}
	}
}

// At dial time a name resolving to kasa's own address is refused in the forms a DNS64 resolver
// or a 6to4 relay hands out too (an IPv6-only network reaches kasa's IPv4 load balancer through
// 64:ff9b::/96), under any policy.
func TestDialRefusesKasaItselfBehindNAT64(t *testing.T) {
	t.Parallel()
	own := NewOwnHosts([]string{"93.184.215.0/24"})
	for _, tc := range []struct{ address, refused string }{
		{"93.184.215.14:443", "93.184.215.14 is one of kasa's own addresses"},
		{"[64:ff9b::5db8:d70e]:443", "64:ff9b::5db8:d70e is one of kasa's own addresses"},
		{"[2002:5db8:d70e::1]:443", "2002:5db8:d70e::1 is one of kasa's own addresses"},
		{"[64:ff9b::5db8:d822]:443", ""},
	} {
		for _, private := range []bool{false, true} {
			err := Policy{AllowPrivate: private, Own: own}.dialControl("tcp", tc.address, nil)
			if tc.refused == "" {
				require.NoError(t, err, tc.address)
				continue
			}
			require.EqualError(t, err, tc.refused, tc.address)
		}
	}
}

// The sender follows no redirect: a merchant cannot send kasa on to an address it would not
// have called.
func TestSenderFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	target := newHook(t, answer(http.StatusOK))
	redirector := newHook(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
	})
	s := NewWebhookSender(WebhookSenderOptions{AllowPrivate: true})
	resp, err := s.o.Client.Post(redirector.URL, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
	require.Equal(t, 1, redirector.Count())
	require.Zero(t, target.Count())
}

// A network of kasa's own written IPv4-mapped (::ffff:a.b.c.d/n) is the IPv4 network it maps:
// the addresses checked are unmapped first, so as an IPv6 prefix it would never match.
func TestOwnHostsTakeAnIPv4MappedNetwork(t *testing.T) {
	t.Parallel()
	own := NewOwnHosts([]string{"::ffff:93.184.215.0/120"})
	for address, refused := range map[string]bool{"93.184.215.14:443": true, "[::ffff:93.184.215.14]:443": true, "93.184.216.1:443": false} {
		err := Policy{Own: own}.dialControl("tcp", address, nil)
		require.Equal(t, refused, err != nil, "%s: %v", address, err)
	}
}

// An attempt's error is kept to 500 bytes and must stay valid UTF-8: PostgreSQL refuses a text
// value that is not, and an attempt whose record fails is sent again and again.
func TestTruncateKeepsErrorsValidUTF8(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		n    int
	}{
		{"short", "connection refused", 500},
		{"ascii cut", strings.Repeat("a", 600), 500},
		{"cut inside a rune", strings.Repeat("ş", 300), 501},
		{"cut inside a 4-byte rune", "x" + strings.Repeat("😀", 200), 500},
		{"invalid bytes in a host name", "dial tcp: lookup \xff\xfe.example: no such host", 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := truncate(tc.in, tc.n)
			require.LessOrEqual(t, len(got), tc.n)
			require.True(t, utf8.ValidString(got), "%q", got)
			if utf8.ValidString(tc.in) {
				require.True(t, strings.HasPrefix(tc.in, got), "a prefix of the error")
				require.Greater(t, len(got), min(len(tc.in), tc.n)-4, "cut no more than a rune short")
			}
		})
	}
}
