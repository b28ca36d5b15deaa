package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/kasaapi"
)

// api is a small client of kasa's REST API and the simulator's control API.
type api struct {
	base, sim, admin string
	others           []string // the cluster shape's other APIs: the load spreads over all
	http             *http.Client
}

type answer struct {
	status int
	header http.Header
	body   []byte
	via    string // the API that answered, host:port
}

func (a *api) call(method, url, bearer string, body []byte, headers ...string) (answer, error) {
	r, err := kasaapi.Do(context.Background(), a.http, method, url, bearer, body, headers...)
	host, _, _ := strings.Cut(strings.TrimPrefix(url, "http://"), "/")
	return answer{status: r.Status, header: r.Header, body: r.Body, via: host}, err
}

// admin calls the admin API and decodes a 2xx answer into out.
func (a *api) adminCall(method, path string, body any, out any, headers ...string) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	r, err := a.call(method, a.base+path, a.admin, b, headers...)
	if err != nil {
		return err
	}
	if r.status/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, r.status, r.body)
	}
	if out != nil {
		return json.Unmarshal(r.body, out)
	}
	return nil
}

// post sends a key's request once, to any of the APIs, as a load balancer would.
func (a *api) post(k *keyRecord) (answer, error) {
	base := append([]string{a.base}, a.others...)[rand.IntN(len(a.others)+1)]
	return a.call("POST", base+k.path(), k.Merchant.APIKey, k.body, "Idempotency-Key", k.Key)
}

// replay sends a key's request again for the checks, as a patient client: an answer that asks to
// wait (429 or 503 with Retry-After) is sent again after the wait, for up to a minute.
func (a *api) replay(k *keyRecord) (answer, error) {
	return a.patient("POST", a.base+k.path(), k.Merchant.APIKey, k.body, "Idempotency-Key", k.Key)
}

func (a *api) patient(method, url, bearer string, body []byte, headers ...string) (answer, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := a.call(method, url, bearer, body, headers...)
		wait, ok := retryAfter(r)
		if err != nil || !ok || time.Now().Add(wait).After(deadline) {
			return r, err
		}
		time.Sleep(wait)
	}
}

// retryAfter is the wait an answer asks for: a 429 or a 503 with Retry-After in seconds.
func retryAfter(r answer) (time.Duration, bool) {
	if r.status != http.StatusTooManyRequests && r.status != http.StatusServiceUnavailable {
		return 0, false
	}
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || secs < 0 {
		return 0, false
	}
	return time.Duration(secs) * time.Second, true
}

// resource is a payment or a refund as the API answers it; PaymentID is a refund's payment.
type resource struct {
	payment.Resource
	PaymentID string `json:"payment_id"`
}

// resource is GET path (/v1/payments/{id}, /v1/refunds/{id}, /v1/payments?idempotency_key=K);
// ok is false on 404.
func (a *api) resource(apiKey, path string) (p resource, ok bool, err error) {
	ok, err = a.get(apiKey, a.base+path, &p)
	return p, ok, err
}

// get is GET url as a patient client, a 200's body decoded into out; found is false on 404.
func (a *api) get(apiKey, url string, out any) (found bool, err error) {
	r, err := a.patient("GET", url, apiKey, nil)
	if err == nil && r.status != http.StatusOK && r.status != http.StatusNotFound {
		err = fmt.Errorf("GET %s: %d %s", url, r.status, r.body)
	}
	if err != nil || r.status == http.StatusNotFound {
		return false, err
	}
	return true, json.Unmarshal(r.body, out)
}

// bank is the simulator's control API.
func (a *api) bank() banksim.Control { return banksim.Control{URL: a.sim, Client: a.http} }

// ready waits until every API answers /readyz.
func (a *api) ready(within time.Duration) error {
	for _, base := range append([]string{a.base}, a.others...) {
		if err := a.waitOK(base+"/readyz", within); err != nil {
			return err
		}
	}
	return nil
}

// waitOK polls url until it answers 200 or the deadline passes.
func (a *api) waitOK(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		r, err := a.call("GET", url, "", nil)
		if err == nil && r.status == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("%d %s", r.status, r.body)
			}
			return fmt.Errorf("%s did not answer 200 within %s: %v", url, within, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// gauges reads the values of the named unlabelled metrics from the API's GET /metrics.
func (a *api) gauges(names ...string) ([]float64, error) {
	r, err := a.patient("GET", a.base+"/metrics", "", nil)
	if err != nil {
		return nil, err
	}
	if r.status != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %d", r.status)
	}
	out := make([]float64, len(names))
	for i, name := range names {
		_, v, found := strings.Cut("\n"+string(r.body), "\n"+name+" ")
		v, _, _ = strings.Cut(v, "\n")
		if out[i], err = strconv.ParseFloat(strings.TrimSpace(v), 64); !found || err != nil {
			return nil, fmt.Errorf("GET /metrics: no value of %s", name)
		}
	}
	return out, nil
}
