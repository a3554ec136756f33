package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/ferrymq/ferry/broker"
)

// Broker is the SQS adapter; see the package documentation.
type Broker struct {
	cfg    Config
	log    *slog.Logger
	client *sqs.Client
	ctx    context.Context // done at Close
	cancel context.CancelFunc

	mu           sync.Mutex
	closed       bool
	exchange     string                     // of the last Declare: Publish routes on it
	topos        map[string]broker.Topology // exchange -> topology
	queues       map[string]*queueInfo      // ferry queue name -> declared queue
	subs         map[*subscription]struct{}
	open         map[*delivery]struct{} // handed out, unsettled
	declMu       sync.Mutex             // serialises re-declares
	fallbackOnce sync.Once
	sendCalls    atomic.Int64 // SendMessageBatch calls made (tests)
	// pollsEnd is when the last long poll a closed subscription cancelled
	// ends on the server (subscription.Close).
	pollsEnd time.Time
}

// abandon notes the server-side end of the long polls in polls, which a
// closing subscription is about to cancel.
func (b *Broker) abandon(polls map[*int]time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, end := range polls {
		if end.After(b.pollsEnd) {
			b.pollsEnd = end
		}
	}
}

// abandonedUntil returns the visibility timeout (whole seconds, 0..20+1)
// that keeps a released message hidden until every long poll a closed
// subscription cancelled has ended on the server, so that none of them
// receives it (subscription.Close).
func (b *Broker) abandonedUntil() int32 {
	b.mu.Lock()
	end := b.pollsEnd
	b.mu.Unlock()
	left := time.Until(end)
	if left <= 0 {
		return 0
	}
	return int32((left + time.Second - 1) / time.Second)
}

// queueInfo is one declared work queue and its DLQ on the server.
type queueInfo struct {
	exchange string
	q        broker.Queue
	name     string // SQS name
	dlqName  string
	mu       sync.Mutex
	url      string
	dlqURL   string
	limit    int  // MaximumMessageSize, bytes
	declared bool // by this broker (else looked up by DLQ: never re-created)
}

func (qi *queueInfo) urls() (string, string) {
	qi.mu.Lock()
	defer qi.mu.Unlock()
	return qi.url, qi.dlqURL
}

var _ broker.Broker = (*Broker)(nil)

// New connects to SQS and checks that the endpoint answers (ListQueues).
// It returns an error when it cannot be reached within ctx; an error
// wrapping broker.ErrInvalidConfig, before any request, for a Config that
// Validate refuses; and one wrapping broker.ErrRefused, with the server's
// words, when the server refuses the credentials or the signature
// (InvalidClientTokenId, UnrecognizedClientException,
// SignatureDoesNotMatch, AccessDenied..., or an HTTP 401 or 403 answer).
// ElasticMQ accepts any credentials, so only AWS (and emulators that check
// them) refuse.
func New(ctx context.Context, cfg Config) (*Broker, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// The HTTP client's timeout outlasts the long poll (WaitTimeSeconds),
	// and it keeps a connection idle for every call the broker may have in
	// flight (the SDK keeps 10 per host, so a busier broker would open and
	// close a connection, and on AWS do a TLS handshake, per call).
	hc := awshttp.NewBuildableClient().WithTimeout(cfg.WaitTime + 15*time.Second).
		WithTransportOptions(func(t *http.Transport) {
			t.MaxIdleConns = max(t.MaxIdleConns, idleConns)
			t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, idleConns)
		})
	opts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(cfg.Region),
		awsconfig.WithHTTPClient(hc),
		awsconfig.WithRetryer(func() aws.Retryer {
			// No client-side retry quota: during an outage it would turn
			// into "retry quota exceeded" errors after the server is back.
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts = 3
				o.MaxBackoff = 2 * time.Second
				o.RateLimiter = ratelimit.None
			})
		}),
	}
	if localEndpoint(cfg.Endpoint) && os.Getenv("AWS_ACCESS_KEY_ID") == "" && os.Getenv("AWS_PROFILE") == "" {
		// A local emulator (ElasticMQ, LocalStack) takes any credentials;
		// without this the SDK would probe the EC2 metadata service.
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("ferry", "ferry", "")))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("sqs: load AWS configuration: %w", err)
	}
	client := sqs.NewFromConfig(awsCfg, func(o *sqs.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.APIOptions = append(o.APIOptions, cfg.APIOptions...)
	})
	if _, err := client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)}); err != nil {
		if credentialRefusal(err) {
			return nil, fmt.Errorf("sqs: connect %s: %w: %w", endpointName(cfg), broker.ErrRefused, err)
		}
		return nil, fmt.Errorf("sqs: connect %s: %w", endpointName(cfg), err)
	}
	bctx, cancel := context.WithCancel(context.Background())
	return &Broker{
		cfg: cfg, log: cfg.Logger.With("broker", "sqs"), client: client, ctx: bctx, cancel: cancel,
		topos: map[string]broker.Topology{}, queues: map[string]*queueInfo{},
		subs: map[*subscription]struct{}{}, open: map[*delivery]struct{}{},
	}, nil
}

// idleConns is the HTTP client's idle connections to the endpoint: a
// relay's claim loops times SendConcurrency, the pollers, the Acks'
// DeleteMessageBatch calls and the heartbeats.
const idleConns = 256

// credentialRefusal reports whether err, from a request, is the server
// refusing the credentials: one of refusalCodes, or an HTTP 401 or 403
// answer other than an expired token or request (which fresh credentials
// from the SDK's chain or a new request can cure).
func credentialRefusal(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		if refusalCodes[ae.ErrorCode()] {
			return true
		}
		if c := ae.ErrorCode(); c == "ExpiredToken" || c == "RequestExpired" {
			return false
		}
	}
	var re *awshttp.ResponseError
	return errors.As(err, &re) && (re.HTTPStatusCode() == 401 || re.HTTPStatusCode() == 403)
}

// localEndpoint reports whether endpoint is on loopback.
func localEndpoint(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || endpoint == "" {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func endpointName(c Config) string {
	if c.Endpoint != "" {
		return c.Endpoint
	}
	return "AWS " + c.Region
}

// Client returns the SDK client the broker uses (tests, tools).
func (b *Broker) Client() *sqs.Client { return b.client }

// Capabilities: native delay up to 12 h (ChangeMessageVisibility), routing
// with wildcards done by the adapter, receive counts as attempts, per-key
// order on FIFO queues. MaxMessageBytes is 0 (unknown) until Declare has
// read the queues' MaximumMessageSize; then the smallest of them minus a
// 2 KiB reserve for ferry's attributes and the DLQ's headers.
func (b *Broker) Capabilities() broker.Capabilities {
	c := broker.Capabilities{
		Name:               "sqs",
		NativeDelay:        true,
		MaxDelay:           MaxVisibility,
		Wildcards:          true,
		CountsRedeliveries: true,
		RetryInPlace:       true,
	}
	if b.cfg.FIFO {
		c.Ordering = broker.OrderingKey
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, qi := range b.queues {
		qi.mu.Lock()
		l := qi.limit - dlqReserve
		qi.mu.Unlock()
		if l > 0 && (c.MaxMessageBytes == 0 || l < c.MaxMessageBytes) {
			c.MaxMessageBytes = l
		}
	}
	return c
}

// Declare creates, for each queue, its DLQ and the work queue (with a
// RedrivePolicy to the DLQ), tagged with the exchange and queue names, and
// reads back their attributes and tags: settings other than ferry's are
// an error wrapping broker.ErrTopologyMismatch.
func (b *Broker) Declare(ctx context.Context, t broker.Topology) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := t.Validate(); err != nil {
		return err
	}
	// A queue with priorities is a queue per level (broker.Queue.Priorities).
	t = t.Expanded()
	seen := map[string]string{}
	for _, q := range t.Queues {
		n := QueueName(t.Exchange, q.Name, b.cfg.FIFO)
		if other, ok := seen[n]; ok {
			return fmt.Errorf("sqs: queues %s and %s map to the same SQS queue %s", other, q.Name, n)
		}
		seen[n] = q.Name
	}
	var infos []*queueInfo
	for _, q := range t.Queues {
		qi := &queueInfo{exchange: t.Exchange, q: q, declared: true,
			name:    QueueName(t.Exchange, q.Name, b.cfg.FIFO),
			dlqName: QueueName(t.Exchange, broker.DLQName(q.Name), b.cfg.FIFO)}
		if err := b.declareQueue(ctx, qi); err != nil {
			return err
		}
		infos = append(infos, qi)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	b.exchange = t.Exchange
	b.topos[t.Exchange] = t
	for _, qi := range infos {
		b.queues[qi.q.Name] = qi
	}
	return nil
}

func (b *Broker) check() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return broker.ErrClosed
	}
	return nil
}

func (b *Broker) baseAttrs() map[string]string {
	a := map[string]string{"MessageRetentionPeriod": retention}
	if b.cfg.FIFO {
		a["FifoQueue"] = "true"
	}
	return a
}

// declareQueue creates qi's DLQ and work queue (idempotent) and fills in
// their URLs and size limit.
func (b *Broker) declareQueue(ctx context.Context, qi *queueInfo) error {
	tags := map[string]string{tagExchange: qi.exchange, tagQueue: qi.q.Name}
	dlqTags := map[string]string{tagExchange: qi.exchange, tagQueue: broker.DLQName(qi.q.Name)}
	dlqURL, err := b.createQueue(ctx, qi.dlqName, b.baseAttrs(), dlqTags)
	if err != nil {
		return err
	}
	dlqAttrs, err := b.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(dlqURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}})
	if err != nil {
		return fmt.Errorf("sqs: declare %s: read attributes of DLQ %s: %w", qi.q.Name, qi.dlqName, err)
	}
	arn := dlqAttrs.Attributes["QueueArn"]
	if arn == "" {
		return fmt.Errorf("sqs: declare %s: DLQ %s has no QueueArn", qi.q.Name, qi.dlqName)
	}
	attrs := b.baseAttrs()
	rp, _ := json.Marshal(map[string]any{"deadLetterTargetArn": arn, "maxReceiveCount": b.cfg.MaxReceiveCount})
	attrs["RedrivePolicy"] = string(rp)
	url, err := b.createQueue(ctx, qi.name, attrs, tags)
	if err != nil {
		return err
	}
	got, err := b.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}})
	if err != nil {
		return fmt.Errorf("sqs: declare %s: read attributes of %s: %w", qi.q.Name, qi.name, err)
	}
	if err := b.compareAttrs(qi.name, attrs, got.Attributes); err != nil {
		return err
	}
	if err := b.compareAttrs(qi.dlqName, b.baseAttrs(), dlqAttrs.Attributes); err != nil {
		return err
	}
	if err := b.compareTags(ctx, qi.name, url, tags); err != nil {
		return err
	}
	if err := b.compareTags(ctx, qi.dlqName, dlqURL, dlqTags); err != nil {
		return err
	}
	limit := b.sizeLimit(qi.name, got.Attributes)
	if dl := b.sizeLimit(qi.dlqName, dlqAttrs.Attributes); dl < limit {
		limit = dl
	}
	qi.mu.Lock()
	qi.url, qi.dlqURL, qi.limit = url, dlqURL, limit
	qi.mu.Unlock()
	return nil
}

// sizeLimit is the queue's MaximumMessageSize attribute (bytes), or
// Config.FallbackMessageBytes when the server does not report it
// (ElasticMQ 1.6.11 does not).
func (b *Broker) sizeLimit(name string, attrs map[string]string) int {
	if n, err := strconv.Atoi(attrs["MaximumMessageSize"]); err == nil && n > dlqReserve {
		return n
	}
	b.fallbackOnce.Do(func() {
		b.log.Info("sqs: the server does not report MaximumMessageSize; using the fallback",
			"queue", name, "bytes", b.cfg.FallbackMessageBytes)
	})
	return b.cfg.FallbackMessageBytes
}

// createQueue creates the queue or finds it with the same attributes.
func (b *Broker) createQueue(ctx context.Context, name string, attrs, tags map[string]string) (string, error) {
	out, err := b.client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs, Tags: tags})
	if err != nil {
		var exists *types.QueueNameExists
		if errors.As(err, &exists) || apiCode(err) == "QueueAlreadyExists" {
			hint := ""
			if _, ok := attrs["RedrivePolicy"]; ok {
				hint = " (its RedrivePolicy carries sqs.Config.MaxReceiveCount, ferry --sqs-max-receive-count, which every process declaring the queue must give alike)"
			}
			return "", fmt.Errorf("%w: SQS queue %s exists with other attributes (want %v)%s: %v", broker.ErrTopologyMismatch, name, attrs, hint, err)
		}
		return "", fmt.Errorf("sqs: create queue %s: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// compareAttrs reports the first attribute of want that got differs in.
func (b *Broker) compareAttrs(name string, want, got map[string]string) error {
	for k, w := range want {
		g := got[k]
		if k == "RedrivePolicy" {
			if !sameRedrive(w, g) {
				return fmt.Errorf("%w: SQS queue %s: RedrivePolicy is %s, ferry declares %s (every process declaring the queue must use the same sqs.Config.MaxReceiveCount, ferry --sqs-max-receive-count)", broker.ErrTopologyMismatch, name, g, w)
			}
			continue
		}
		if k == "FifoQueue" && g == "" {
			g = "false"
		}
		if _, reported := got[k]; !reported && k != "FifoQueue" {
			// Not every server reports every attribute (ElasticMQ 1.6.11
			// omits MessageRetentionPeriod).
			continue
		}
		if g != w {
			return fmt.Errorf("%w: SQS queue %s: %s is %q, ferry declares %q", broker.ErrTopologyMismatch, name, k, g, w)
		}
	}
	if want["FifoQueue"] == "" && got["FifoQueue"] == "true" {
		return fmt.Errorf("%w: SQS queue %s is a FIFO queue, ferry declares a standard one", broker.ErrTopologyMismatch, name)
	}
	return nil
}

func sameRedrive(want, got string) bool {
	var w, g struct {
		Arn   string `json:"deadLetterTargetArn"`
		Count any    `json:"maxReceiveCount"`
	}
	if json.Unmarshal([]byte(want), &w) != nil || json.Unmarshal([]byte(got), &g) != nil {
		return false
	}
	return arnName(w.Arn) == arnName(g.Arn) && fmt.Sprint(w.Count) == fmt.Sprint(g.Count)
}

func arnName(arn string) string { return arn[strings.LastIndex(arn, ":")+1:] }

func (b *Broker) compareTags(ctx context.Context, name, url string, want map[string]string) error {
	out, err := b.client.ListQueueTags(ctx, &sqs.ListQueueTagsInput{QueueUrl: aws.String(url)})
	if err != nil {
		return fmt.Errorf("sqs: read tags of %s: %w", name, err)
	}
	for k, w := range want {
		if g := out.Tags[k]; g != w {
			return fmt.Errorf("%w: SQS queue %s belongs to %s %q, not %q (two ferry names map to one SQS name)", broker.ErrTopologyMismatch, name, k, g, w)
		}
	}
	return nil
}

// redeclare re-creates qi after the server said it does not exist
// (deleted under a running process).
func (b *Broker) redeclare(ctx context.Context, qi *queueInfo) error {
	b.declMu.Lock()
	defer b.declMu.Unlock()
	b.log.Warn("sqs: queue does not exist; declaring it again", "queue", qi.q.Name, "sqs_queue", qi.name)
	return b.declareQueue(ctx, qi)
}

// apiCode returns the API error code of err, or "".
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// notExist reports whether err says the queue does not exist.
func notExist(err error) bool {
	var qne *types.QueueDoesNotExist
	if errors.As(err, &qne) {
		return true
	}
	c := apiCode(err)
	return c == "AWS.SimpleQueueService.NonExistentQueue" || c == "QueueDoesNotExist" || c == "NonExistentQueue"
}

// opCtx bounds ctx by d when it has no deadline, and by Close.
func (b *Broker) opCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if _, ok := ctx.Deadline(); !ok {
		ctx, cancel = context.WithTimeout(ctx, d)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	stop := context.AfterFunc(b.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// Close stops every subscription, makes the messages received and not
// settled visible again (ChangeMessageVisibility 0, within 3 s) and
// releases the client. A second Close returns nil.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	subs := make([]*subscription, 0, len(b.subs))
	for s := range b.subs {
		subs = append(subs, s)
	}
	var open []*delivery
	for d := range b.open {
		open = append(open, d)
	}
	b.open = map[*delivery]struct{}{}
	b.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range subs {
		wg.Add(1)
		go func() { defer wg.Done(); s.shutdown(ctx) }()
	}
	wg.Wait()
	byURL := map[string][]*delivery{}
	for _, d := range open {
		byURL[d.url] = append(byURL[d.url], d)
	}
	vis := b.abandonedUntil()
	for url, ds := range byURL {
		b.release(ctx, url, ds, vis)
	}
	b.cancel()
	return nil
}

// release makes the messages of ds visible again after vis seconds (0:
// at once; best effort).
func (b *Broker) release(ctx context.Context, url string, ds []*delivery, vis int32) {
	for i := 0; i < len(ds); i += MaxBatchEntries {
		var entries []types.ChangeMessageVisibilityBatchRequestEntry
		for j, d := range ds[i:min(i+MaxBatchEntries, len(ds))] {
			entries = append(entries, types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String("r" + strconv.Itoa(j)), ReceiptHandle: aws.String(d.receipt), VisibilityTimeout: vis})
		}
		if _, err := b.client.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{
			QueueUrl: aws.String(url), Entries: entries}); err != nil {
			b.log.Debug("sqs: release unsettled messages", "err", err)
		}
	}
}

// visibilitySeconds rounds d up to whole seconds within 0..12 h.
func visibilitySeconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	if d > MaxVisibility {
		d = MaxVisibility
	}
	return int32((d + time.Second - 1) / time.Second)
}

var _ broker.LimitReporter = (*Broker)(nil)

// Limits implements broker.LimitReporter for a declared queue, without
// I/O: Declare made sure the queue's RedrivePolicy and
// MessageRetentionPeriod on the server are the ones ferry declares (else
// it failed with broker.ErrTopologyMismatch). DeliveryLimit is
// Config.MaxReceiveCount (SQS moves a message to the DLQ itself once it
// was received that many times, and every attempt is a receive);
// MaxAckDeadline and SettleTimeout are MaxVisibility (a visibility
// timeout of at most 12 hours, which ChangeMessageVisibility cannot extend
// past 12 hours after the receive); Retention is the queue's
// MessageRetentionPeriod, 14 days (a retry in place keeps the message's
// send time). Returns broker.ErrUnknownQueue for a queue not declared on
// this broker, broker.ErrClosed after Close.
func (b *Broker) Limits(ctx context.Context, queue string) (broker.Limits, error) {
	if err := b.check(); err != nil {
		return broker.Limits{}, err
	}
	b.mu.Lock()
	qi, ok := b.queues[queue]
	b.mu.Unlock()
	if !ok || !qi.declared {
		return broker.Limits{}, fmt.Errorf("%w: %s was not declared on this broker", broker.ErrUnknownQueue, queue)
	}
	ret, _ := strconv.Atoi(retention)
	return broker.Limits{
		DeliveryLimit:         b.cfg.MaxReceiveCount,
		DeliveryLimitSetting:  fmt.Sprintf("sqs.Config.MaxReceiveCount (ferry --sqs-max-receive-count; maxReceiveCount of the RedrivePolicy of SQS queue %q)", qi.name),
		MaxAckDeadline:        MaxVisibility,
		MaxAckDeadlineSetting: "SQS's longest visibility timeout (12h)",
		SettleTimeout:         MaxVisibility,
		SettleTimeoutSetting:  "SQS's visibility limit (no receive stays hidden past 12h)",
		Retention:             time.Duration(ret) * time.Second,
		RetentionSetting:      fmt.Sprintf("the MessageRetentionPeriod of SQS queue %q (the maximum, set by ferry)", qi.name),
	}, nil
}

var _ broker.BacklogReporter = (*Broker)(nil)

// Backlog implements broker.BacklogReporter: ApproximateNumberOfMessages
// plus ...NotVisible (in flight, or waiting for a retry's delay) plus
// ...Delayed of the work queue, and its MessageRetentionPeriod (14 days;
// SQS deletes a message that old, received or not). OldestAge is 0: SQS
// reports the age of the oldest message only as the CloudWatch metric
// ApproximateAgeOfOldestMessage, not through GetQueueAttributes; alarm on
// that metric against the retention.
func (b *Broker) Backlog(ctx context.Context, queue string) (broker.Backlog, error) {
	var bl broker.Backlog
	if err := b.check(); err != nil {
		return bl, err
	}
	b.mu.Lock()
	qi, ok := b.queues[queue]
	b.mu.Unlock()
	if !ok || !qi.declared {
		return bl, fmt.Errorf("%w: %s was not declared on this broker", broker.ErrUnknownQueue, queue)
	}
	url, _ := qi.urls()
	if _, has := ctx.Deadline(); !has {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.cfg.PublishTimeout)
		defer cancel()
	}
	out, err := b.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}})
	if err != nil {
		return bl, fmt.Errorf("sqs: backlog of %s: read attributes of %s: %w", queue, qi.name, err)
	}
	for _, a := range []string{"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"} {
		n, _ := strconv.ParseInt(out.Attributes[a], 10, 64)
		bl.Messages += n
	}
	secs, err := strconv.Atoi(out.Attributes["MessageRetentionPeriod"])
	if err != nil { // not reported (ElasticMQ 1.6.11): what Declare set
		secs, _ = strconv.Atoi(retention)
	}
	bl.Retention = time.Duration(secs) * time.Second
	return bl, nil
}
