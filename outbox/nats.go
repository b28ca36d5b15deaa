package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Broker settings of the KASA_EVENTS stream.
const (
	// DuplicateWindow is how long the broker remembers a Nats-Msg-Id. A relay that dies after
	// publishing and before marking is de-duplicated by the broker if it republishes within the
	// window, by the consumers' inboxes otherwise.
	DuplicateWindow = 2 * time.Minute
	// StreamMaxAge bounds the stream; consumers must not fall further behind than this, and the
	// inbox keeps ids at least as long (Retention's default).
	StreamMaxAge = 7 * 24 * time.Hour
)

// StartEmbedded runs a NATS server with JetStream in this process, storing its data under dir
// (it survives restarts, and every write is fsynced), listening on a free loopback port. stop
// shuts it down and waits.
func StartEmbedded(dir string) (url string, stop func(), err error) {
	return startEmbedded(dir, server.RANDOM_PORT)
}

func startEmbedded(dir string, port int) (url string, stop func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	// The server does not lock its store: a second one on dir (another relay, or kasa dev, on
	// the same data directory) would write the same stream files. The kernel lets go of the
	// lock when this process ends, however it ends.
	lock, err := os.OpenFile(filepath.Join(dir, "kasa-broker.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", nil, err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(lock.Name())
		lock.Close()
		return "", nil, fmt.Errorf("another embedded NATS server runs on %s (pid %s): give each process its own "+
			"KASA_DATA_DIR, or share one broker with KASA_NATS_URL: %w", dir, strings.TrimSpace(string(holder)), err)
	}
	if err := lock.Truncate(0); err == nil {
		_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	ns, err := server.NewServer(&server.Options{
		ServerName: "kasa-embedded",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		// fsync every write, not every two minutes: a power loss then takes no acknowledged
		// message. Measured here it still stores ~1,700 messages/s one by one and ~3,800/s in
		// the relay's batches, far above what kasa publishes; the relay's re-publication of
		// what the inbox lacks covers any other loss.
		SyncAlways: true,
		NoSigs:     true,
		NoLog:      true,
	})
	if err != nil {
		return "", nil, fmt.Errorf("embedded nats: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return "", nil, errors.New("embedded nats: not ready after 10s")
	}
	return ns.ClientURL(), func() { ns.Shutdown(); ns.WaitForShutdown(); lock.Close() }, nil
}

// BrokerAuth is how kasa authenticates to an external broker and checks its certificate. The
// zero value uses neither (the embedded broker, or a broker on a trusted network).
type BrokerAuth struct {
	Creds   string // a NATS .creds file: a user JWT and its nkey seed
	TLSCA   string // PEM bundle the broker's certificate must chain to (the system's roots otherwise)
	TLSCert string // PEM client certificate, for a broker that verifies clients (with TLSKey)
	TLSKey  string
}

// options are the nats.go options of a; files are read when connecting.
func (a BrokerAuth) options() ([]nats.Option, error) {
	var opts []nats.Option
	if a.Creds != "" {
		if _, err := os.Stat(a.Creds); err != nil {
			return nil, fmt.Errorf("nats credentials: %w", err)
		}
		opts = append(opts, nats.UserCredentials(a.Creds))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	switch {
	case a.TLSCert != "" && a.TLSKey != "":
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	case a.TLSCert != "" || a.TLSKey != "":
		return nil, errors.New("nats client certificate: set both the certificate and its key")
	}
	return opts, nil
}

// Connect dials the broker (reconnecting forever) with auth and opens its JetStream context.
// Close the connection with nc.Drain or nc.Close.
func Connect(url, name string, auth BrokerAuth) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := auth.options()
	if err != nil {
		return nil, nil, err
	}
	opts = append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("nats %s: %w", redactURLs(url), err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// EnsureStream creates the KASA_EVENTS stream, or updates it to these settings.
func EnsureStream(ctx context.Context, js jetstream.JetStream) (jetstream.Stream, error) {
	// Create only when missing, never update: a stream update racing a consumer's creation is a
	// data race inside nats-server v2.15.3 (seen under -race), and every relay and consumer
	// calls this at start. Changing the stream's config is a deliberate, one-off operation.
	if s, err := js.Stream(ctx, StreamName); err == nil {
		return s, nil
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        StreamName,
		Description: "kasa domain events from the transactional outbox",
		Subjects:    []string{SubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      StreamMaxAge,
		Duplicates:  DuplicateWindow,
		Discard:     jetstream.DiscardOld,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, StreamName) // another process created it first
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", StreamName, err)
	}
	return s, nil
}
