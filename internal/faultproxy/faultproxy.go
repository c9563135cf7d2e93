// Package faultproxy is a TCP proxy for tests that sits between a client and
// a server on 127.0.0.1 and misbehaves on demand: it delays the server's
// replies, swallows them, or cuts every connection. Requests always reach the
// server, so a test sees exactly what a client sees when the network, not
// the server, fails: the server decided, and the answer came late or never.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections accepted on Addr to a target address. Its
// methods are safe for concurrent use.
type Proxy struct {
	target   string
	listener net.Listener

	mu    sync.Mutex
	delay time.Duration // added to every reply chunk read from the target
	drop  bool          // reply chunks are read from the target and discarded
	conns map[*link]struct{}
	// queued, when set, is called with each reply chunk's delay once the
	// chunk is queued for delivery: a test's sign that a reply is held.
	queued func(delay time.Duration)

	wg sync.WaitGroup // the accept loop and every pipe goroutine
}

// link is one proxied connection: client side and target side.
type link struct {
	client, server net.Conn
	once           sync.Once
	closed         chan struct{}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.closed)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// chunk is one read from the target, due for delivery at due.
type chunk struct {
	data []byte
	due  time.Time
}

// Start listens on a free port of 127.0.0.1 and forwards every connection to
// target. Close stops it.
func Start(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, listener: l, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients should dial instead of the target.
func (p *Proxy) Addr() string { return p.listener.Addr().String() }

// SetDelay holds every reply chunk read from the target from now on for d
// before passing it to the client; 0 forwards at once. Order is kept: a
// chunk never overtakes an earlier one.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// SetDrop makes the proxy swallow, while on, every reply chunk read from the
// target: requests are still delivered and executed, the client just never
// hears back. Connections stay open.
func (p *Proxy) SetDrop(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = on
}

// CutAll closes every open connection, on both sides. New connections are
// accepted as before.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Conns returns the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	err := p.listener.Close()
	p.CutAll()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		l := &link{client: client, server: server, closed: make(chan struct{})}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()

		replies := make(chan chunk, 1024)
		p.wg.Add(3)
		go func() { // requests: client to target, untouched
			defer p.wg.Done()
			_, _ = io.Copy(server, client)
			l.close()
		}()
		go func() { // replies: target to the delivery queue
			defer p.wg.Done()
			defer close(replies)
			p.readReplies(l, replies)
		}()
		go func() { // replies: delivery queue to client
			defer p.wg.Done()
			p.deliver(l, replies)
			p.mu.Lock()
			delete(p.conns, l)
			p.mu.Unlock()
		}()
	}
}

// readReplies reads the target's replies and queues them with the delay in
// force when they were read, or drops them.
func (p *Proxy) readReplies(l *link, out chan<- chunk) {
	for {
		buf := make([]byte, 32<<10)
		n, err := l.server.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay, drop, queued := p.delay, p.drop, p.queued
			p.mu.Unlock()
			if !drop {
				out <- chunk{data: buf[:n], due: time.Now().Add(delay)}
				if queued != nil {
					queued(delay)
				}
			}
		}
		if err != nil {
			l.close()
			return
		}
	}
}

// deliver writes queued replies to the client when they are due. It drains
// the queue after a write error so that readReplies never blocks.
func (p *Proxy) deliver(l *link, in <-chan chunk) {
	broken := false
	for c := range in {
		if broken {
			continue
		}
		if wait := time.Until(c.due); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-l.closed:
				timer.Stop()
				broken = true
				continue
			}
		}
		if _, err := l.client.Write(c.data); err != nil {
			l.close()
			broken = true
		}
	}
	l.close()
}
