package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// links are the in-process Toxiproxy proxies kasa reaches PostgreSQL and the bank through.
type links struct {
	server  *toxiproxy.ApiServer
	proxies map[string]*toxiproxy.Proxy
}

func newLinks() *links {
	return &links{
		server:  toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		proxies: map[string]*toxiproxy.Proxy{},
	}
}

// add starts a proxy to upstream on a free loopback port and returns its address.
func (l *links) add(name, upstream string) (string, error) {
	p := toxiproxy.NewProxy(l.server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return "", fmt.Errorf("proxy %s: %w", name, err)
	}
	l.proxies[name] = p
	return p.Listen, nil
}

// inject adds the fault's toxic to its link.
func (l *links) inject(f Fault) error {
	p, ok := l.proxies[f.Target]
	if !ok {
		return fmt.Errorf("no link %q", f.Target)
	}
	attrs := map[string]int{}
	switch f.Toxic {
	case "latency":
		attrs["latency"], attrs["jitter"] = f.ToxicMS, f.ToxicMS/4
	case "timeout", "reset_peer":
		attrs["timeout"] = f.ToxicMS
	}
	body, err := json.Marshal(map[string]any{
		"name": "soak", "type": f.Toxic, "stream": f.Stream, "toxicity": f.Toxicity, "attributes": attrs,
	})
	if err != nil {
		return err
	}
	_, err = p.Toxics.AddToxicJson(bytes.NewReader(body))
	return err
}

// heal removes every toxic of the fault's link.
func (l *links) heal(f Fault) {
	if p, ok := l.proxies[f.Target]; ok {
		p.Toxics.ResetToxics(context.Background())
	}
}

func (l *links) stop() {
	for _, p := range l.proxies {
		p.Stop()
	}
}
