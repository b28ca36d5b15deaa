package soak

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kasa-pay/kasa/payment"
)

// api is a small client of kasa's REST API and the simulator's control API.
type api struct {
	base, sim, admin string
	http             *http.Client
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a *api) call(method, url, bearer string, body []byte, headers ...string) (answer, error) {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
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

func (a *api) pay(apiKey, key string, body []byte) (answer, error) {
	return a.call("POST", a.base+"/v1/payments", apiKey, body, "Idempotency-Key", key)
}

// payment is GET /v1/payments/{id}; ok is false on 404.
func (a *api) payment(apiKey, id string) (p payment.Resource, ok bool, err error) {
	return a.getPayment(apiKey, a.base+"/v1/payments/"+id)
}

// paymentByKey is GET /v1/payments?idempotency_key=K; ok is false on 404.
func (a *api) paymentByKey(apiKey, key string) (p payment.Resource, ok bool, err error) {
	return a.getPayment(apiKey, a.base+"/v1/payments?idempotency_key="+key)
}

func (a *api) getPayment(apiKey, url string) (p payment.Resource, ok bool, err error) {
	r, err := a.call("GET", url, apiKey, nil)
	switch {
	case err != nil:
		return p, false, err
	case r.status == http.StatusNotFound:
		return p, false, nil
	case r.status != http.StatusOK:
		return p, false, fmt.Errorf("GET %s: %d %s", url, r.status, r.body)
	}
	return p, true, json.Unmarshal(r.body, &p)
}

// account is GET /v1/accounts/{id}.
func (a *api) account(apiKey, id string) (balance, reserved string, err error) {
	r, err := a.call("GET", a.base+"/v1/accounts/"+id, apiKey, nil)
	if err != nil {
		return "", "", err
	}
	if r.status != http.StatusOK {
		return "", "", fmt.Errorf("GET account %s: %d %s", id, r.status, r.body)
	}
	var acct struct{ Balance, Reserved string }
	err = json.Unmarshal(r.body, &acct)
	return acct.Balance, acct.Reserved, err
}

// simCharges is GET /_sim/charges?reference=: how many times money moved, and the charge ids.
func (a *api) simCharges(reference string) (int, []string, error) {
	r, err := a.call("GET", a.sim+"/_sim/charges?reference="+reference, "", nil)
	if err != nil {
		return 0, nil, err
	}
	if r.status != http.StatusOK {
		return 0, nil, fmt.Errorf("sim charges: %d %s", r.status, r.body)
	}
	var out struct {
		Count   int `json:"count"`
		Charges []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"charges"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil {
		return 0, nil, err
	}
	var ids []string
	for _, c := range out.Charges {
		if c.Status == "succeeded" {
			ids = append(ids, c.ID)
		}
	}
	return out.Count, ids, nil
}

// setBankRules replaces the simulator's fault rules; none clears them.
func (a *api) setBankRules(rules []map[string]any) error {
	var r answer
	var err error
	if len(rules) == 0 {
		r, err = a.call("DELETE", a.sim+"/_sim/faults", "", nil)
	} else {
		b, _ := json.Marshal(map[string]any{"rules": rules})
		r, err = a.call("PUT", a.sim+"/_sim/faults", "", b)
	}
	if err != nil {
		return err
	}
	if r.status/100 != 2 {
		return fmt.Errorf("sim faults: %d %s", r.status, r.body)
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
