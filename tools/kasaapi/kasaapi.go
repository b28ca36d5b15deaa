// Package kasaapi is the developer tools' one HTTP client of kasa's REST API (and of the other
// JSON endpoints they call): the end-to-end tests, the soak and the benchmark send through it.
package kasaapi

import (
	"bytes"
	"context"
	"io"
	"net/http"
)

// Answer is an HTTP answer, its body read whole.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends one request to url: bearer (when not empty) as the Authorization token, body (when
// not nil) as JSON, and headers in pairs ("Idempotency-Key", "k1"). A transport error is
// returned as it is: a caller may be testing a process that is down on purpose. The body is
// read to its end, so that hc reuses the connection.
func Do(ctx context.Context, hc *http.Client, method, url, bearer string, body []byte, headers ...string) (Answer, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Answer{}, err
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
	resp, err := hc.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Answer{}, err
	}
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}
