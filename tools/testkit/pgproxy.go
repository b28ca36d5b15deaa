package testkit

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// CommitCutter stands between a store and PostgreSQL and loses the answer of a commit: armed
// with a piece of SQL, it lets the next transaction that runs a statement containing it end in
// PostgreSQL, and then closes that connection before the client hears how it ended. It is what
// a connection that drops right after COMMIT was sent does to kasa.
type CommitCutter struct {
	URL string // the database URL through the cutter

	mu    sync.Mutex
	armed []arming // the pieces of SQL whose transactions lose (or hold) their answers, in turn
	cut   atomic.Int32
}

// arming is one piece of SQL the cutter is armed for; with hold, the answer is held until hold
// is closed rather than lost, and ended is closed once the transaction ended in PostgreSQL.
type arming struct {
	sql         string
	hold, ended chan struct{}
}

// NewCommitCutter starts a cutter in front of the database at databaseURL (a TCP one, without
// TLS) until the test ends.
func NewCommitCutter(t testing.TB, databaseURL string) *CommitCutter {
	t.Helper()
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	upstream := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	u.Host = ln.Addr().String()
	c := &CommitCutter{URL: u.String()}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = client.Close()
				continue
			}
			go c.proxy(client, server)
		}
	}()
	return c
}

// LoseCommitOf arms the cutter: the next transaction that runs a statement containing sql
// commits (or ends however it ends) without its answer reaching the client.
func (c *CommitCutter) LoseCommitOf(sql string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = append(c.armed, arming{sql: sql})
}

// HoldAnswerOf arms the cutter to hold, rather than lose, the answer of the next transaction
// that runs a statement containing sql: ended is closed once that transaction has ended in
// PostgreSQL, and its client hears the answer only after release.
func (c *CommitCutter) HoldAnswerOf(sql string) (ended <-chan struct{}, release func()) {
	a := arming{sql: sql, hold: make(chan struct{}), ended: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = append(c.armed, a)
	return a.ended, sync.OnceFunc(func() { close(a.hold) })
}

// Cut is how many answers the cutter lost.
func (c *CommitCutter) Cut() int { return int(c.cut.Load()) }

// take disarms and returns the arming sql is a statement of, if any.
func (c *CommitCutter) take(sql string) *arming {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.IndexFunc(c.armed, func(a arming) bool { return strings.Contains(sql, a.sql) })
	if i < 0 {
		return nil
	}
	a := c.armed[i]
	c.armed = slices.Delete(c.armed, i, i+1)
	return &a
}

// proxy copies one connection both ways, reading the protocol's messages: a statement run
// (a Bind of a parsed statement, or a simple Query) marks the connection, and the next
// ReadyForQuery outside a transaction is where the marked transaction ended.
func (c *CommitCutter) proxy(client, server net.Conn) {
	var marked atomic.Pointer[arming]
	closeBoth := func() { _ = client.Close(); _ = server.Close() }
	go func() {
		defer closeBoth()
		statements := map[string]string{} // prepared statement name -> SQL
		first := true
		for {
			msg, err := readMessage(client, first)
			if err != nil {
				return
			}
			first = false
			if len(msg) > 5 {
				var sql string // what the message runs, by its first two strings
				s1, rest, _ := bytes.Cut(msg[5:], []byte{0})
				s2, _, _ := bytes.Cut(rest, []byte{0})
				switch msg[0] {
				case 'P': // Parse: name, query
					statements[string(s1)] = string(s2)
				case 'B': // Bind: portal, statement
					sql = statements[string(s2)]
				case 'Q': // Query: query
					sql = string(s1)
				}
				if sql != "" {
					if a := c.take(sql); a != nil {
						marked.Store(a)
					}
				}
			}
			if _, err := server.Write(msg); err != nil {
				return
			}
		}
	}()
	defer closeBoth()
	var held []byte // the marked transaction's answers, held back until it ends
	for {
		msg, err := readMessage(server, false)
		if err != nil {
			return
		}
		a := marked.Load()
		if a == nil {
			if _, err := client.Write(msg); err != nil {
				return
			}
			continue
		}
		held = append(held, msg...)
		if msg[0] != 'Z' {
			continue
		}
		if len(msg) > 5 && msg[5] == 'I' && a.hold != nil { // over: its answer waits for release
			close(a.ended)
			<-a.hold
			marked.Store(nil)
		} else if len(msg) > 5 && msg[5] == 'I' { // the transaction is over: its answer is lost
			c.cut.Add(1)
			return
		}
		if _, err := client.Write(held); err != nil {
			return
		}
		held = held[:0]
	}
}

// readMessage reads one protocol message whole: a type byte and a length, or (the client's
// first message, the startup) a length only.
func readMessage(r io.Reader, startup bool) ([]byte, error) {
	head := 5
	if startup {
		head = 4
	}
	msg := make([]byte, head)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(msg[head-4:])) - 4
	if n < 0 {
		return nil, io.ErrUnexpectedEOF
	}
	msg = append(msg, make([]byte, n)...)
	_, err := io.ReadFull(r, msg[head:])
	return msg, err
}
