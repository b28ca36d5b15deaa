package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/workflows"
)

// temporalAddress is the frontend kasa dials: the configured one, else a local dev server.
func temporalAddress(cfg config.Config) string {
	if cfg.Temporal.Address == "" {
		return "127.0.0.1:7233"
	}
	return cfg.Temporal.Address
}

// temporalOptions are every client's options but the address. An error is a setting that can
// never work (an unreadable certificate), reported before anything is dialed.
func temporalOptions(cfg config.Config, log *slog.Logger) (client.Options, error) {
	quiet := slog.New(&levelFloor{Handler: log.Handler(), min: slog.LevelWarn})
	o := client.Options{Namespace: cfg.Temporal.Namespace, Logger: tlog.NewStructuredLogger(quiet)}
	if !cfg.Temporal.Gzip {
		o.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	}
	var err error
	if o.ConnectionOptions.TLS, err = temporalTLS(cfg); err != nil {
		return client.Options{}, err
	}
	if cfg.Temporal.APIKey != "" {
		o.Credentials = client.NewAPIKeyStaticCredentials(cfg.Temporal.APIKey)
		// The SDK would turn TLS on by itself; set here so that what is dialed is plain to see.
		if o.ConnectionOptions.TLS == nil {
			o.ConnectionOptions.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
		}
	}
	return o, nil
}

// temporalTLS is the TLS configuration of the Temporal connection, nil when none is asked for
// (a plain connection, as to a dev server).
func temporalTLS(cfg config.Config) (*tls.Config, error) {
	t := cfg.Temporal
	if t.TLSCert == "" && t.TLSKey == "" && t.TLSCA == "" && t.TLSServerName == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.TLSServerName}
	switch {
	case (t.TLSCert == "") != (t.TLSKey == ""):
		return nil, errors.New("KASA_TEMPORAL_TLS_CERT and KASA_TEMPORAL_TLS_KEY go together (mTLS needs both)")
	case t.TLSCert != "":
		cert, err := tls.LoadX509KeyPair(t.TLSCert, t.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("KASA_TEMPORAL_TLS_CERT / KASA_TEMPORAL_TLS_KEY: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if t.TLSCA != "" {
		pem, err := os.ReadFile(t.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("KASA_TEMPORAL_TLS_CA: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("KASA_TEMPORAL_TLS_CA: no PEM certificate in %s", t.TLSCA)
		}
	}
	return c, nil
}

// dialTemporal connects to the frontend. A lazy client does not need Temporal to be up: `kasa
// api` starts anyway, answers 503 while Temporal is away and recovers on its own when it returns.
func dialTemporal(ctx context.Context, cfg config.Config, log *slog.Logger, lazy bool) (client.Client, error) {
	o, err := temporalOptions(cfg, log)
	if err != nil {
		return nil, err
	}
	o.HostPort = temporalAddress(cfg)
	if lazy {
		return client.NewLazyClient(o)
	}
	return client.DialContext(ctx, o)
}

// waitTemporal dials Temporal and checks the namespace, waiting while the frontend cannot be
// reached or the namespace does not exist yet (a cluster still coming up, or set up after
// kasa): a worker starts when Temporal does instead of exiting. Settings that can never work
// (certificates, credentials the server refuses, a TLS handshake with a plain server) end it
// at once.
func waitTemporal(ctx context.Context, cfg config.Config, log *slog.Logger) (client.Client, error) {
	wlog := log.With("address", temporalAddress(cfg), "namespace", cfg.Temporal.Namespace)
	return waitFor(ctx, wlog, 5*time.Second, func() (client.Client, string, error) {
		tc, err := dialNamespace(ctx, cfg, log)
		if err == nil {
			return tc, "", nil
		}
		if reason, ok := temporalWaitReason(err); ok {
			return nil, "waiting for Temporal: " + reason, err
		}
		return nil, "", fmt.Errorf("temporal at %s, namespace %q: %w", temporalAddress(cfg), cfg.Temporal.Namespace, err)
	})
}

// dialNamespace dials the frontend and describes the namespace: the SDK's dial only asks for
// the server's capabilities, and a worker on a missing namespace fails later, at its start.
func dialNamespace(ctx context.Context, cfg config.Config, log *slog.Logger) (client.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tc, err := dialTemporal(dctx, cfg, log, false)
	if err != nil {
		return nil, err
	}
	if _, err := tc.WorkflowService().DescribeNamespace(dctx, &workflowservice.DescribeNamespaceRequest{Namespace: cfg.Temporal.Namespace}); err != nil {
		tc.Close()
		return nil, err
	}
	return tc, nil
}

// tlsSettingsWrong is whether a connection error says the TLS settings cannot work, rather than
// that the server is away (a reset or EOF in a handshake, say, while it restarts).
func tlsSettingsWrong(msg string) bool {
	for _, s := range []string{"x509: ", "remote error: tls: ", "first record does not look like a TLS handshake", "tls: failed to verify"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// temporalWaitReason says why waiting for Temporal may help, or false when it cannot.
func temporalWaitReason(err error) (string, bool) {
	var notFound *serviceerror.NamespaceNotFound
	var unavailable *serviceerror.Unavailable
	var deadline *serviceerror.DeadlineExceeded
	switch {
	case errors.As(err, &notFound):
		return "namespace not found", true
	case tlsSettingsWrong(err.Error()):
		// A TLS client on a plain server, a certificate the server refuses or cannot verify,
		// or none where the server requires one: no retry mends it.
		return "", false
	case errors.As(err, &unavailable), errors.As(err, &deadline), errors.Is(err, context.DeadlineExceeded):
		return "unreachable", true
	}
	return "", false
}

// searchAttributes is the API's readiness check and `kasa migrate`'s registration of the search
// attributes the payment workflows set: without them every workflow start fails.
type searchAttributes struct {
	client    client.Client
	namespace string
}

// kasaSearchAttributes are the attributes the workflows set, with their types.
func kasaSearchAttributes() map[string]enumspb.IndexedValueType {
	return map[string]enumspb.IndexedValueType{
		workflows.SearchPaymentStatus.GetName():  enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		workflows.SearchMerchantID.GetName():     enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		workflows.SearchPaymentSummary.GetName(): enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	}
}

// MissingSearchAttributes lists the attributes the namespace lacks, sorted. One registered with
// another type counts as missing: the workflows could not set it either.
// Credentials that may not list them (some Temporal Cloud keys) cannot tell: then readiness
// does not hold the API back on their account.
func (a searchAttributes) MissingSearchAttributes(ctx context.Context) ([]string, error) {
	missing, _, err := a.missing(ctx)
	var denied *serviceerror.PermissionDenied
	var unimplemented *serviceerror.Unimplemented
	if errors.As(err, &denied) || errors.As(err, &unimplemented) {
		return nil, nil
	}
	return missing, err
}

func (a searchAttributes) missing(ctx context.Context) ([]string, map[string]enumspb.IndexedValueType, error) {
	resp, err := a.client.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: a.namespace})
	if err != nil {
		return nil, nil, fmt.Errorf("list search attributes of namespace %q: %w", a.namespace, err)
	}
	var missing []string
	add := map[string]enumspb.IndexedValueType{}
	for name, typ := range kasaSearchAttributes() {
		got, ok := resp.GetCustomAttributes()[name]
		switch {
		case !ok:
			missing = append(missing, name)
			add[name] = typ
		case got != typ:
			missing = append(missing, fmt.Sprintf("%s (registered as %s, needs %s)", name, got, typ))
		}
	}
	slices.Sort(missing)
	return missing, add, nil
}

// register adds the missing attributes; it returns the names it added.
func (a searchAttributes) register(ctx context.Context) ([]string, error) {
	missing, add, err := a.missing(ctx)
	// The namespace was just described, but the operator service reads the server's namespace
	// cache, which may not know a namespace registered a moment ago until its next refresh.
	var notFound *serviceerror.NamespaceNotFound
	for errors.As(err, &notFound) {
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
		missing, add, err = a.missing(ctx)
	}
	if err != nil {
		return nil, err
	}
	if len(missing) > len(add) {
		return nil, fmt.Errorf("namespace %q: search attributes with the wrong type: %s (remove and add them again)", a.namespace, strings.Join(missing, ", "))
	}
	if len(add) == 0 {
		return nil, nil
	}
	_, err = a.client.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{Namespace: a.namespace, SearchAttributes: add})
	var denied *serviceerror.PermissionDenied
	var unimplemented *serviceerror.Unimplemented
	if errors.As(err, &denied) || errors.As(err, &unimplemented) {
		return nil, fmt.Errorf("add search attributes %s to namespace %q: %w; "+
			"these credentials may not add them (on Temporal Cloud add them with tcld or the Cloud UI, docs/operations.md) "+
			"and set KASA_TEMPORAL_REGISTER_SEARCH_ATTRIBUTES=false", strings.Join(missing, ", "), a.namespace, err)
	}
	if err != nil {
		return nil, fmt.Errorf("add search attributes %s to namespace %q: %w", strings.Join(missing, ", "), a.namespace, err)
	}
	return missing, a.waitUsable(ctx)
}

// waitUsable waits until the frontend accepts a query on every attribute. The server lists an
// added attribute at once, but starts that set it fail until its namespace cache has been
// refreshed (every 10 s by default): returning before would leave /readyz answering 200 while
// payments fail.
func (a searchAttributes) waitUsable(ctx context.Context) error {
	var terms []string
	for name := range kasaSearchAttributes() {
		terms = append(terms, name+" = 'kasa-migrate'")
	}
	slices.Sort(terms)
	req := &workflowservice.CountWorkflowExecutionsRequest{Namespace: a.namespace, Query: strings.Join(terms, " AND ")}
	for {
		_, err := a.client.WorkflowService().CountWorkflowExecutions(ctx, req)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %q: search attributes added but not yet usable: %w", a.namespace, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// migrateSearchAttributes is `kasa migrate`'s Temporal step: when Temporal is configured, add
// the search attributes the namespace lacks. A Temporal that cannot be reached is only a
// warning: the database is migrated, and /readyz says 503 while the attributes are missing.
func migrateSearchAttributes(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if cfg.Temporal.Address == "" || !cfg.Temporal.RegisterSearchAttributes {
		return nil
	}
	if _, err := temporalOptions(cfg, log); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tc, err := dialNamespace(ctx, cfg, log)
	if err != nil {
		// The reason says which: a frontend away, or a namespace not created yet (or misspelt).
		if reason, transient := temporalWaitReason(err); transient {
			log.Warn("search attributes not checked (Temporal: "+reason+"); run kasa migrate again once Temporal answers for the namespace (/readyz answers 503 while they are missing)",
				"address", cfg.Temporal.Address, "namespace", cfg.Temporal.Namespace, "error", err)
			return nil
		}
		return fmt.Errorf("temporal at %s, namespace %q: %w", cfg.Temporal.Address, cfg.Temporal.Namespace, err)
	}
	defer tc.Close()
	added, err := searchAttributes{client: tc, namespace: cfg.Temporal.Namespace}.register(ctx)
	if err != nil {
		return err
	}
	if len(added) > 0 {
		log.Info("search attributes registered", "namespace", cfg.Temporal.Namespace, "added", strings.Join(added, ","))
	}
	return nil
}
