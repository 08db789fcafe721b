// A direct embatch request over NATS (nats.go) with the full recovery guarantee: acknowledgement,
// heartbeat and resend, as docs/nats-contract.md ("Acknowledgement and resend") states them. A
// plain nc.RequestMsg is lost when nats-server drops the message or the worker holding it dies;
// this one is resent. The same program as examples/direct_nats_resend.py.
//
// Usage: go run ./resend [NATS_URL] [text ...]          (in examples/go)
// Environment: EMBATCH_SUBJECT (default "embed").
// Exit status: 0 embedded, 1 error reply or no reply within the 10 s deadline, 3 no worker
// listening (no responders for 150 ms).
//
// How: the request asks for an acknowledgement (Embatch-Ack: 1), carries an Embatch-Request-Id
// and names a heartbeat subject of this client's own (Embatch-Heartbeat-To). A worker that still
// holds it 20 ms after reading it sends an empty message with Embatch-Accepted-By (its id) on the
// reply subject, then beats on the heartbeat subject every 100 ms while it holds it; the reply
// follows on the reply subject. The request is resent (same id, Embatch-Attempt set to the copy's
// number, the deadline that is left) when:
//   - neither an acknowledgement nor the reply came within 120 ms (doubling at each resend):
//     nobody has it;
//   - the worker that acknowledged it has not been heard for 500 ms: it died;
//   - that worker beats with a larger Embatch-Worker-Connects than its acknowledgement carried:
//     it reconnected to NATS, and a reply sent before may be lost;
//   - a worker answered 503 (its upstream died, or it is stopping).
//
// Beats on <subject>.alive count too (workers before contract 1.6 beat there). After a resend,
// the id goes to <subject>.cancel once the reply is in, so a worker still holding another copy
// drops it. "No responders" (no worker in the queue group: they leave it while full and
// re-subscribe after a reconnect) is retried after 10, 20, 40 and 80 ms, as the contract says.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	deadline  = 10 * time.Second
	firstWait = 120 * time.Millisecond // the workers' 20 ms acknowledgement delay + a margin
	silence   = 500 * time.Millisecond // an acknowledging worker not heard for this long has died
	// "No responders" is retried this many times, after 10, 20, 40, 80 ms.
	noRespondersRetries        = 4
	acceptedBy, workerConnects = "Embatch-Accepted-By", "Embatch-Worker-Connects"
)

func main() { os.Exit(run()) }

func run() int {
	url := nats.DefaultURL
	if len(os.Args) > 1 {
		url = os.Args[1]
	}
	texts := []string{"Direct NATS requests skip the gateway.", "Any language with a NATS client works."}
	if len(os.Args) > 2 {
		texts = os.Args[2:]
	}
	subject := os.Getenv("EMBATCH_SUBJECT")
	if subject == "" {
		subject = "embed"
	}

	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot connect to %s: %v\n", url, err)
		return 1
	}
	defer nc.Close()
	inbox := nats.NewInbox()
	beats := inbox + ".alive"
	// Replies, our own heartbeats and the shared ones, in arrival order.
	mailbox := make(chan *nats.Msg, 64)
	for _, s := range []string{inbox, beats, subject + ".alive"} {
		if _, err := nc.ChanSubscribe(s, mailbox); err != nil {
			fmt.Fprintf(os.Stderr, "cannot subscribe to %s: %v\n", s, err)
			return 1
		}
	}

	body, _ := json.Marshal(map[string]any{"inputs": texts, "normalize": true})
	due := time.Now().Add(deadline)
	wait, attempt, noResponders, resend := firstWait, 0, 0, true
	var reply *nats.Msg
	var sent, heard time.Time
	var acked string
	connects := -1 // the acknowledgement's Embatch-Worker-Connects; -1: none (an older worker)
	for reply == nil && time.Now().Before(due) {
		if resend {
			attempt, resend, acked, sent = attempt+1, false, "", time.Now()
			if err := nc.PublishMsg(request(subject, inbox, beats, body, attempt, due)); err != nil {
				fmt.Fprintf(os.Stderr, "publish failed: %v\n", err)
				return 1
			}
		}
		// Until when to wait: the acknowledgement, or the next word from the worker holding it.
		until := sent.Add(wait)
		if acked != "" {
			until = heard.Add(silence)
		}
		timer := time.NewTimer(time.Until(until))
		var m *nats.Msg
		select {
		case m = <-mailbox:
		case <-timer.C:
		}
		timer.Stop()
		switch {
		case m == nil: // nobody has it, or its worker died
			if acked == "" {
				wait *= 2
			}
			resend = true
		case m.Subject != inbox: // a heartbeat: the body is the worker's id
			if acked != "" && string(m.Data) == acked {
				heard = time.Now()
				n, err := strconv.Atoi(m.Header.Get(workerConnects))
				resend = connects >= 0 && err == nil && n > connects
			}
		case m.Header.Get(acceptedBy) != "": // held: now wait for the reply, as long as its worker lives
			acked, heard, connects = m.Header.Get(acceptedBy), time.Now(), -1
			if n, err := strconv.Atoi(m.Header.Get(workerConnects)); err == nil {
				connects = n
			}
		case m.Header.Get("Status") == "503" && len(m.Data) == 0: // no responders
			if noResponders == noRespondersRetries {
				fmt.Fprintf(os.Stderr, "no embatch worker is listening on `%s` (503)\n", subject)
				return 3
			}
			time.Sleep(10 * time.Millisecond << noResponders)
			noResponders, resend = noResponders+1, true
		case m.Header.Get("Nats-Service-Error-Code") == "503" && time.Until(due) > wait:
			time.Sleep(wait) // that worker cannot serve it: another may
			resend = true
		default:
			reply = m
		}
	}
	if attempt > 1 && reply != nil {
		_ = nc.Publish(subject+".cancel", []byte(inbox))
		_ = nc.Flush()
	}

	if reply == nil {
		fmt.Fprintf(os.Stderr, "no reply within %d s (504)\n", deadline/time.Second)
		return 1
	}
	if code := reply.Header.Get("Nats-Service-Error-Code"); code != "" {
		var e struct {
			Error     string `json:"error"`
			ErrorType string `json:"error_type"`
		}
		_ = json.Unmarshal(reply.Data, &e)
		fmt.Fprintf(os.Stderr, "error %s %s: %s\n", code, e.ErrorType, e.Error)
		return 1
	}
	var embeddings [][]float32
	if err := json.Unmarshal(reply.Data, &embeddings); err != nil {
		fmt.Fprintf(os.Stderr, "reply is not a JSON array of float arrays: %v\n", err)
		return 1
	}
	if len(embeddings) != len(texts) {
		fmt.Fprintf(os.Stderr, "%d vectors for %d inputs\n", len(embeddings), len(texts))
		return 1
	}
	for i, vector := range embeddings {
		head := make([]string, 0, 4)
		for _, x := range vector[:min(4, len(vector))] {
			head = append(head, fmt.Sprintf("%+.4f", x))
		}
		fmt.Printf("[nats] %d dims  [%s, ...]  %s\n", len(vector), strings.Join(head, ", "), texts[i])
	}
	return 0
}

// request is copy number attempt of the request, with the deadline that is left.
func request(subject, inbox, beats string, body []byte, attempt int, due time.Time) *nats.Msg {
	msg := nats.NewMsg(subject)
	msg.Reply, msg.Data = inbox, body
	msg.Header.Set("Embatch-Ack", "1")
	msg.Header.Set("Embatch-Request-Id", inbox)
	msg.Header.Set("Embatch-Heartbeat-To", beats)
	msg.Header.Set("Embatch-Deadline-Ms", strconv.FormatInt(time.Until(due).Milliseconds(), 10))
	msg.Header.Set("Embatch-Version", "1")
	if attempt > 1 {
		msg.Header.Set("Embatch-Attempt", strconv.Itoa(attempt))
	}
	return msg
}
