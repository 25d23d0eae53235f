// mail.go: the SMTP client that mailto: endpoints (webhook.go) and owner
// notifications (ownernotify.go) send through: one message a connection,
// STARTTLS when offered, and a Message-ID of <event id@host>, the same on
// every attempt, so a mailbox merges the duplicate that a crash between
// send and mark produces. A 250 means accepted, not delivered: bounces are
// out of scope.

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// MailConfig is how outboxd sends mail; see mail.go.
type MailConfig struct {
	// SMTPURL is smtp://user:pass@host:port (STARTTLS whenever the server
	// offers it; port 587 by default) or smtps://... (TLS from the first
	// byte; port 465). Empty: no mail is sent, and mail jobs complete
	// with a log line.
	SMTPURL string
	// From is the envelope and header sender, a bare address.
	From string
	// MessageIDHost is the right side of every Message-ID; empty: the
	// domain of From.
	MessageIDHost string
	// OwnerNotifyPerHour caps the mails about failing and disabled
	// endpoints one owner gets in an hour. Five tells an owner that
	// something is wrong without turning a flapping endpoint into a flood
	// that trains them to filter us out.
	OwnerNotifyPerHour int
}

// validate checks the mail settings; its errors name the flags (setting).
func (c MailConfig) validate() error {
	if c.From != "" {
		if err := validateBareAddress(c.From); err != nil {
			return fmt.Errorf("%s: %w", setting("smtp-from"), err)
		}
	}
	if c.SMTPURL == "" {
		return nil
	}
	u, err := url.Parse(c.SMTPURL)
	if err != nil {
		// url.Parse's error quotes the URL, password included: not shown.
		return fmt.Errorf("%s is not a URL", setting("smtp-url"))
	}
	if u.Scheme != "smtp" && u.Scheme != "smtps" {
		return fmt.Errorf("%s must start with smtp:// or smtps://, got %q", setting("smtp-url"), u.Redacted())
	}
	if u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%s must be smtp[s]://[user:pass@]host[:port], got %q", setting("smtp-url"), u.Redacted())
	}
	if c.From == "" {
		return fmt.Errorf("%s is required with %s", setting("smtp-from"), setting("smtp-url"))
	}
	return nil
}

// maxAddressLen is RFC 5321's limit on a forward path.
const maxAddressLen = 254

// validateBareAddress accepts a@example.com and nothing around it.
func validateBareAddress(s string) error {
	addr, err := mail.ParseAddress(s)
	if err != nil || addr.Name != "" || addr.Address != s || !strings.Contains(s, "@") {
		return fmt.Errorf("%q is not an e-mail address like someone@example.com", s)
	}
	return nil
}

// mailer sends one message a connection. A nil *mailer, or one without a
// server, is "no SMTP configured".
type mailer struct {
	server        *url.URL
	from          string
	messageIDHost string
	// tlsConfig is for STARTTLS and smtps; its ServerName is set per dial.
	tlsConfig *tls.Config
}

// newMailer builds the mailer of a validated configuration; nil when no
// server is configured.
func newMailer(cfg MailConfig) *mailer {
	if cfg.SMTPURL == "" {
		return nil
	}
	u, _ := url.Parse(cfg.SMTPURL) // validated at start
	host := cfg.MessageIDHost
	if host == "" {
		host = cfg.From[strings.LastIndexByte(cfg.From, '@')+1:]
	}
	return &mailer{server: u, from: cfg.From, messageIDHost: host, tlsConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
}

func (m *mailer) configured() bool { return m != nil && m.server != nil }

// mailMessage is one message to one recipient about one event.
type mailMessage struct {
	To      string
	Subject string
	Body    string
	EventID int64 // makes the Message-ID: the same on every attempt
}

// messageID is <event id@host>.
func (m *mailer) messageID(eventID int64) string {
	return "<" + strconv.FormatInt(eventID, 10) + "@" + m.messageIDHost + ">"
}

// headerText makes s safe for a header: no line breaks (no header
// injection from a subject), RFC 2047 encoded when it is not ASCII.
func headerText(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return mime.QEncoding.Encode("utf-8", s)
}

// compose is the message as sent: headers, then the body in
// quoted-printable, so no line passes SMTP's 998-character limit whatever
// the payload holds.
func (m *mailer) compose(msg mailMessage, now time.Time) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "From: <%s>\r\n", m.from)
	fmt.Fprintf(&b, "To: <%s>\r\n", msg.To)
	fmt.Fprintf(&b, "Subject: %s\r\n", headerText(msg.Subject))
	fmt.Fprintf(&b, "Date: %s\r\n", now.Format(time.RFC1123Z))
	fmt.Fprintf(&b, "Message-ID: %s\r\n", m.messageID(msg.EventID))
	b.WriteString("MIME-Version: 1.0\r\n")
	b.WriteString("Content-Type: text/plain; charset=utf-8\r\n")
	b.WriteString("Content-Transfer-Encoding: quoted-printable\r\n")
	b.WriteString("Auto-Submitted: auto-generated\r\n\r\n")
	qp := quotedprintable.NewWriter(&b)
	body := strings.ReplaceAll(strings.ReplaceAll(msg.Body, "\r\n", "\n"), "\n", "\r\n")
	if _, err := qp.Write([]byte(body)); err != nil {
		return nil, err
	}
	if err := qp.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// send delivers msg to the server: one connection, STARTTLS when offered
// on smtp://, AUTH PLAIN when the URL has a user (net/smtp refuses it
// without TLS except on loopback), MAIL, RCPT, DATA, QUIT. ctx bounds the
// whole exchange.
func (m *mailer) send(ctx context.Context, msg mailMessage) error {
	data, err := m.compose(msg, time.Now())
	if err != nil {
		return fmt.Errorf("compose mail: %w", err)
	}
	c, stop, err := m.dial(ctx)
	if err != nil {
		return err
	}
	defer stop()
	defer c.Close()
	if err := m.hello(c); err != nil {
		return err
	}
	if err := c.Mail(m.from); err != nil {
		return fmt.Errorf("smtp: MAIL FROM: %w", err)
	}
	if err := c.Rcpt(msg.To); err != nil {
		return fmt.Errorf("smtp: RCPT TO: %w", err)
	}
	w, err := c.Data()
	if err != nil {
		return fmt.Errorf("smtp: DATA: %w", err)
	}
	if _, err := w.Write(data); err != nil {
		return fmt.Errorf("smtp: DATA: %w", err)
	}
	// Close ends DATA and reads the server's answer: from here the
	// message is the server's.
	if err := w.Close(); err != nil {
		return fmt.Errorf("smtp: DATA: %w", err)
	}
	// A failed QUIT changes nothing: the message was accepted.
	c.Quit()
	return nil
}

// dial connects to the server (TLS from the first byte for smtps://) and
// reads its greeting. net/smtp takes no context, so the connection's
// deadline is ctx's, and ctx's end closes the exchange at once until stop
// is called.
func (m *mailer) dial(ctx context.Context) (c *smtp.Client, stop func() bool, err error) {
	host := m.server.Hostname()
	port := m.server.Port()
	if port == "" {
		port = map[string]string{"smtp": "587", "smtps": "465"}[m.server.Scheme]
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, nil, fmt.Errorf("smtp: %w", err)
	}
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	stop = context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	if m.server.Scheme == "smtps" {
		conn = tls.Client(conn, m.tlsFor(host))
	}
	c, err = smtp.NewClient(conn, host)
	if err != nil {
		stop()
		conn.Close()
		return nil, nil, fmt.Errorf("smtp: greeting: %w", err)
	}
	return c, stop, nil
}

// hello introduces us, upgrades smtp:// to TLS when the server offers it,
// and authenticates when the URL names a user.
func (m *mailer) hello(c *smtp.Client) error {
	host := m.server.Hostname()
	if err := c.Hello(m.messageIDHost); err != nil {
		return fmt.Errorf("smtp: EHLO: %w", err)
	}
	if m.server.Scheme == "smtp" {
		if ok, _ := c.Extension("STARTTLS"); ok {
			if err := c.StartTLS(m.tlsFor(host)); err != nil {
				return fmt.Errorf("smtp: STARTTLS: %w", err)
			}
		}
	}
	if user := m.server.User; user != nil {
		password, _ := user.Password()
		if err := c.Auth(smtp.PlainAuth("", user.Username(), password, host)); err != nil {
			return fmt.Errorf("smtp: AUTH: %w", err)
		}
	}
	return nil
}

// tlsFor is the TLS configuration for a connection to host.
func (m *mailer) tlsFor(host string) *tls.Config {
	c := m.tlsConfig.Clone()
	c.ServerName = host
	return c
}

// mailtoPrefix marks an endpoint delivered by mail.
const mailtoPrefix = "mailto:"

// validateMailtoURL accepts mailto:someone@example.com: one bare address,
// no headers or query (no "?cc=" or "?body=" smuggled into a message).
func validateMailtoURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || !strings.EqualFold(u.Scheme, "mailto") {
		return "", fmt.Errorf("url %q is not a mailto: URL", raw)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque == "" {
		return "", fmt.Errorf("url %q must be mailto: and one address, without headers", raw)
	}
	addr, err := url.PathUnescape(u.Opaque)
	if err != nil || strings.Contains(addr, ",") {
		return "", fmt.Errorf("url %q must name exactly one address", raw)
	}
	if len(addr) > maxAddressLen {
		return "", fmt.Errorf("url %q: address longer than %d bytes", raw, maxAddressLen)
	}
	if err := validateBareAddress(addr); err != nil {
		return "", fmt.Errorf("url %q: %w", raw, err)
	}
	return mailtoPrefix + addr, nil
}

// LogValue shows the server without its password.
func (m *mailer) LogValue() slog.Value {
	if !m.configured() {
		return slog.StringValue("none")
	}
	return slog.StringValue(m.server.Redacted())
}
