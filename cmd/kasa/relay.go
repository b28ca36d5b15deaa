package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/store"
)

// startEvents runs the event pipeline until stop is called: the broker (embedded under the data
// dir unless nats.url names one), the outbox relay, the webhook consumer and the webhook sender.
// Each part is safe to run in several processes at once.
func startEvents(ctx context.Context, cfg config.Config, st *store.Store, reg prometheus.Registerer, log *slog.Logger) (stop func(), err error) {
	var cleanup []func()
	undo := func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}
	url := cfg.NATS.URL
	var auth outbox.BrokerAuth // the embedded broker listens on loopback only and needs none
	if url != "" {
		auth = outbox.BrokerAuth{Creds: cfg.NATS.Creds, TLSCA: cfg.NATS.TLSCA, TLSCert: cfg.NATS.TLSCert, TLSKey: cfg.NATS.TLSKey}
	} else {
		if cfg.NATS.Creds+cfg.NATS.TLSCA+cfg.NATS.TLSCert != "" {
			log.Warn("KASA_NATS_CREDS and KASA_NATS_TLS_* apply to an external broker only; KASA_NATS_URL is unset, so the embedded one is used")
		}
		var stopBroker func()
		url, stopBroker, err = outbox.StartEmbedded(filepath.Join(cfg.Data.Dir, "nats"))
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, func() { log.Info("stopping the embedded NATS server"); stopBroker() })
		log.Info("embedded NATS JetStream", "url", url, "dir", filepath.Join(cfg.Data.Dir, "nats"))
	}
	// As the worker waits for Temporal: a broker not up yet (restarting, or started after kasa)
	// is waited for, while credentials or TLS settings it refuses end the start at once.
	var js jetstream.JetStream
	nc, err := waitFor(ctx, log, 5*time.Second, func() (*nats.Conn, string, error) {
		nc, j, err := outbox.Connect(url, "kasa-relay", auth)
		js = j
		if natsUnreachable(err) {
			return nil, "waiting for NATS: unreachable", err
		}
		return nc, "", err
	})
	if err != nil {
		undo()
		return nil, fmt.Errorf("%w (a broker that wants credentials or TLS: KASA_NATS_CREDS, KASA_NATS_TLS_CA, KASA_NATS_TLS_CERT, KASA_NATS_TLS_KEY)", err)
	}
	cleanup = append(cleanup, nc.Close)

	metrics := outbox.NewMetrics(reg)
	runners := map[string]interface{ Run(context.Context) error }{
		"relay": outbox.NewRelay(outbox.RelayOptions{Store: st, JetStream: js, Retention: cfg.Events.Retention,
			RedeliverAfter: cfg.Events.RedeliverAfter, Metrics: metrics, Logger: log}),
		"webhook consumer": outbox.NewWebhookConsumer(outbox.WebhookConsumerOptions{Store: st, JetStream: js, Metrics: metrics, Logger: log}),
		"webhook sender": outbox.NewWebhookSender(outbox.WebhookSenderOptions{
			Store: st, Timeout: cfg.Webhook.Timeout, Concurrency: cfg.Webhook.Concurrency,
			PerMerchant: cfg.Webhook.PerMerchant, RetryFor: cfg.Webhook.RetryFor, AllowPrivate: cfg.Webhook.AllowPrivate, Own: outbox.NewOwnHosts(cfg.Webhook.OwnHosts),
			Metrics: metrics, Logger: log,
		}),
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for name, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(ctx); err != nil && ctx.Err() == nil {
				log.Error(name+" stopped", "error", err)
			}
		}()
	}
	cleanup = append(cleanup, func() { cancel(); wg.Wait() })
	return undo, nil
}

// natsUnreachable is whether connecting failed for want of a broker to dial (none listening,
// no route, no such host): a wait mends that, not a broker refusing the settings.
func natsUnreachable(err error) bool {
	var op *net.OpError
	return errors.Is(err, nats.ErrNoServers) || errors.As(err, &op) && op.Op == "dial"
}

// runRelay is `kasa relay`: the event pipeline on its own, with /metrics and /healthz.
func runRelay(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	st, err := waitStore(ctx, cfg, log, true)
	if err != nil {
		return stoppedOr(ctx, log, err)
	}
	defer st.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	stopEvents, err := startEvents(ctx, cfg, st, reg, log)
	if err != nil {
		return stoppedOr(ctx, log, err)
	}
	defer stopEvents()
	if cfg.Relay.MetricsAddr != "" {
		stop, err := serve(ctx, "relay metrics", cfg.Relay.MetricsAddr, metricsMux(reg), log)
		if err != nil {
			return err
		}
		defer stop()
	}
	<-ctx.Done()
	log.Info("shutting down relay")
	return nil
}
