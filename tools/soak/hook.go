package soak

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/outbox"
)

// event is a webhook the receiver got, once per event id.
type event struct {
	ID, Type string
	Payment  resource // the payment or refund
	Arrived  int      // the receiver's count of deliveries when its first arrived: the order events came in
}

// receiver is the merchants' webhook endpoint: it records each event once (by event id), counts
// repeated deliveries, and checks every signature.
type receiver struct {
	srv     *http.Server
	url     string
	mu      sync.Mutex
	secrets map[string]string // merchant id → webhook secret
	events  map[string]*event
	bad     []string // deliveries that were not a well-formed, correctly signed event
	total   int
}

func startReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/hooks/", secrets: map[string]string{}, events: map[string]*event{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hooks/{merchant}", r.serve)
	r.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) addMerchant(id, secret string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.secrets[id] = secret
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	m := req.PathValue("merchant")
	id := req.Header.Get(outbox.HeaderEventID)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total++
	var ev struct {
		ID   string   `json:"id"`
		Type string   `json:"type"`
		Data resource `json:"data"`
	}
	switch secret, ok := r.secrets[m]; {
	case !ok:
		r.bad = append(r.bad, fmt.Sprintf("event %s for an unknown merchant %s", id, m))
	case outbox.Verify(secret, req.Header.Get(outbox.HeaderSignature), body, 10*time.Minute) != nil:
		r.bad = append(r.bad, fmt.Sprintf("event %s: signature does not verify", id))
	case json.Unmarshal(body, &ev) != nil || ev.ID != id || ev.Type != eventType(ev.Data):
		r.bad = append(r.bad, fmt.Sprintf("event %s: malformed body %.200s", id, body))
	default:
		if _, seen := r.events[id]; !seen { // a repeated delivery counts only in total
			r.events[id] = &event{ID: id, Type: ev.Type, Payment: ev.Data, Arrived: r.total}
		}
	}
	w.WriteHeader(http.StatusOK)
}

// byPayment groups the events by the payment's or refund's id.
func (r *receiver) byPayment() map[string][]event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]event{}
	for _, e := range r.events {
		out[e.Payment.ID] = append(out[e.Payment.ID], *e)
	}
	return out
}

func (r *receiver) stats() (deliveries, events int, bad []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total, len(r.events), append([]string(nil), r.bad...)
}

func (r *receiver) close() { _ = r.srv.Close() }
