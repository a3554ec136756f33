package watermill

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsqs "github.com/ThreeDotsLabs/watermill-aws/sqs"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	smithyendpoints "github.com/aws/smithy-go/endpoints"
	natsgo "github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/ferrymq/ferry/internal/testenv"
)

// A profile is one Watermill configuration on one broker: the forwarder's
// SQL subscriber and the broker's Pub/Sub.
//
// The two profiles of every broker follow one rule. "defaults" is the
// Pub/Sub's zero configuration, or the configuration its own docs and
// tests start from where the zero one cannot run the workload (each
// broker's type says which). "tuned" is what a user chasing throughput
// and latency would set without giving up what ferry gives: the event
// is durably on the broker before the forwarder moves past it (publisher
// confirm, acks=all, PubAck, a SendMessage response) and at least once
// delivery with the consumer's dedup. So tuned may ack asynchronously
// (a lost ack is a redelivery, which the dedup absorbs) but never
// publishes without a confirm. In both, the forwarder is Watermill's
// components/forwarder over watermill-sql: it publishes one message at a
// time, each publish awaited, which no Pub/Sub setting changes.
type profile struct {
	name string // "defaults" or "tuned"
	// pollInterval is watermill-sql's SubscriberConfig.PollInterval for
	// the forwarder (0: its default, 1 s). tuned: 10 ms on every broker,
	// the wait after an empty poll being all of the forwarder's idle
	// latency.
	pollInterval time.Duration
	ps           pubSub
}

func (p profile) String() string {
	poll := p.pollInterval.String()
	if p.pollInterval == 0 {
		poll = "default 1s"
	}
	return fmt.Sprintf("watermill %s: sql PollInterval=%s SubscribeBatchSize=default 100; %s", p.name, poll, p.ps)
}

// pubSub is a broker's Watermill Pub/Sub in one profile.
type pubSub interface {
	// newTopic returns a unique topic name (queue, Kafka topic, stream)
	// for one benchmark run and removes what the run declared at the
	// benchmark's end.
	newTopic(b *testing.B) string
	// publisher is the forwarder's publisher to the broker.
	publisher() (message.Publisher, error)
	// subscriber is the consumers' subscriber; it must implement
	// message.SubscribeInitializer (startPipeline declares the topic
	// with it).
	subscriber(topic string) (message.Subscriber, error)
	// subscriptions is how many Subscribe calls the consumers make.
	subscriptions() int
	// inFlight is how many messages the subscriptions hand out at once
	// (each waits for its message's ack before the next): the
	// consumers' database pool is sized by it.
	inFlight() int
	String() string
}

// peerBroker is one broker the peer runs on.
type peerBroker struct {
	name string // ferry's broker name (ferrycli.Brokers)
	// server is a URL whose port finds the broker's server process for
	// the CPU figures (runcost.Listener).
	server   func() string
	profiles []profile
}

// brokers are the peer's brokers, with the same names as ferry's.
var brokers = []peerBroker{
	{name: "rabbitmq", server: testenv.RabbitMQURL, profiles: []profile{
		{name: "defaults", ps: amqpPubSub{prefetch: 1, consumers: 1}},
		{name: "tuned", pollInterval: 10 * time.Millisecond, ps: amqpPubSub{confirm: true, channelPool: 1, prefetch: 16, consumers: 4}},
	}},
	{name: "kafka", server: func() string { return "kafka://" + testenv.KafkaBrokers()[0] }, profiles: []profile{
		{name: "defaults", ps: kafkaPubSub{partitions: 1}},
		{name: "tuned", pollInterval: 10 * time.Millisecond, ps: kafkaPubSub{partitions: 4, acksAll: true}},
	}},
	{name: "nats", server: testenv.NATSURL, profiles: []profile{
		{name: "defaults", ps: natsPubSub{subscribers: 1}},
		{name: "tuned", pollInterval: 10 * time.Millisecond, ps: natsPubSub{subscribers: 4, ackAsync: true}},
	}},
	{name: "sqs", server: testenv.SQSEndpoint, profiles: []profile{
		{name: "defaults", ps: sqsPubSub{workers: 1, maxMessages: 1}},
		{name: "tuned", pollInterval: 10 * time.Millisecond, ps: sqsPubSub{workers: 4, maxMessages: 10}},
	}},
}

// amqpPubSub is watermill-amqp/v3 on RabbitMQ with
// NewDurableQueueConfig (persistent messages, the default exchange, one
// durable queue per topic).
//
// defaults: NewDurableQueueConfig as it is: no publisher confirms, a new
// channel per Publish, prefetch 1, one subscription. tuned (issue 10):
// Publish.ConfirmDelivery (a publisher confirm per message, ferry's
// durability), ChannelPoolSize 1 (a pooled channel instead of one
// opened per Publish), prefetch 16 and 4 subscriptions (4 messages in
// flight: a subscription hands out its next delivery after the ack).
type amqpPubSub struct {
	confirm     bool // Publish.ConfirmDelivery
	channelPool int  // Publish.ChannelPoolSize (0: a new channel per Publish)
	prefetch    int  // Consume.Qos.PrefetchCount
	consumers   int  // Subscribe calls
}

func (a amqpPubSub) config() amqp.Config {
	cfg := amqp.NewDurableQueueConfig(testenv.RabbitMQURL())
	cfg.Publish.ConfirmDelivery = a.confirm
	cfg.Publish.ChannelPoolSize = a.channelPool
	cfg.Consume.Qos.PrefetchCount = a.prefetch
	return cfg
}

func (a amqpPubSub) newTopic(b *testing.B) string {
	q := testenv.UniqueName("wmbench")
	b.Cleanup(func() {
		conn, err := amqp091.Dial(testenv.RabbitMQURL())
		if err != nil {
			b.Logf("watermill bench: delete queue %s: %v", q, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			b.Logf("watermill bench: delete queue %s: %v", q, err)
			return
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			b.Logf("watermill bench: delete queue %s: %v", q, err)
		}
	})
	return q
}

func (a amqpPubSub) publisher() (message.Publisher, error) {
	return amqp.NewPublisher(a.config(), logger)
}

func (a amqpPubSub) subscriber(string) (message.Subscriber, error) {
	return amqp.NewSubscriber(a.config(), logger)
}

func (a amqpPubSub) subscriptions() int { return a.consumers }
func (a amqpPubSub) inFlight() int      { return a.consumers }

func (a amqpPubSub) String() string {
	return fmt.Sprintf("amqp ConfirmDelivery=%v ChannelPoolSize=%d Prefetch=%d; %d subscriptions", a.confirm, a.channelPool, a.prefetch, a.consumers)
}

// kafkaPubSub is watermill-kafka/v3 (on IBM/sarama) on Kafka: the
// forwarder's publisher is a sarama SyncProducer (one record per
// SendMessage, awaited); the consumers are one subscription in a
// consumer group, which handles its partitions concurrently, one
// message at a time each (the next after the ack: MarkMessage, offsets
// auto-committed every second).
//
// defaults: DefaultSaramaSyncPublisherConfig (acks=1, WaitForLocal) and
// DefaultSaramaSubscriberConfig with Consumer.Offsets.Initial =
// OffsetOldest, the one line Watermill's getting-started guide adds
// (without it a new group starts at the log's end and skips what the
// forwarder published before the group's first assignment); a topic of
// 1 partition, Kafka's num.partitions default. tuned: RequiredAcks =
// WaitForAll (acks=all, ferry's durability; on this one-broker server
// the same replicas as acks=1) and 4 partitions, so 4 messages are in
// flight as with RabbitMQ tuned (the forwarder's records carry no key:
// sarama spreads them over the partitions at random).
type kafkaPubSub struct {
	partitions int32
	acksAll    bool
}

func (k kafkaPubSub) newTopic(b *testing.B) string {
	t := testenv.UniqueName("wmbench")
	b.Cleanup(func() {
		admin, err := sarama.NewClusterAdmin(testenv.KafkaBrokers(), sarama.NewConfig())
		if err != nil {
			b.Logf("watermill bench: delete topic %s: %v", t, err)
			return
		}
		defer admin.Close()
		if err := admin.DeleteConsumerGroup(kafkaGroup(t)); err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
			b.Logf("watermill bench: delete consumer group %s: %v", kafkaGroup(t), err)
		}
		if err := admin.DeleteTopic(t); err != nil {
			b.Logf("watermill bench: delete topic %s: %v", t, err)
		}
	})
	return t
}

// kafkaGroup is the consumers' group on topic.
func kafkaGroup(topic string) string { return topic + "-consumers" }

func (k kafkaPubSub) publisher() (message.Publisher, error) {
	cfg := kafka.DefaultSaramaSyncPublisherConfig()
	if k.acksAll {
		cfg.Producer.RequiredAcks = sarama.WaitForAll
	}
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: testenv.KafkaBrokers(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: cfg,
	}, logger)
}

func (k kafkaPubSub) subscriber(topic string) (message.Subscriber, error) {
	cfg := kafka.DefaultSaramaSubscriberConfig()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: testenv.KafkaBrokers(), Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: cfg,
		ConsumerGroup:          kafkaGroup(topic),
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: k.partitions, ReplicationFactor: 1},
	}, logger)
}

func (k kafkaPubSub) subscriptions() int { return 1 }
func (k kafkaPubSub) inFlight() int      { return int(k.partitions) }

func (k kafkaPubSub) String() string {
	acks := "default 1 (WaitForLocal)"
	if k.acksAll {
		acks = "all (WaitForAll)"
	}
	return fmt.Sprintf("kafka sarama RequiredAcks=%s Offsets.Initial=oldest; %d partitions, 1 subscription in a consumer group", acks, k.partitions)
}

// natsPubSub is watermill-nats/v2's pkg/nats in its JetStream mode (the
// default, JetStreamConfig.Disabled false) on NATS JetStream: the
// forwarder publishes with JetStreamContext.PublishMsg (each PubAck
// awaited); the stream, named like the topic with the topic as its one
// subject, is created by SubscribeInitialize (AutoProvision false, as in
// watermill-nats's tests); each subscriber is a push consumer whose
// callback hands out one message and waits for its ack before the next.
//
// defaults: the zero JetStreamConfig: one subscriber on an ephemeral
// consumer (BindStream), AckSync (each ack awaits the server's reply).
// tuned: 4 subscribers in one queue group on one durable consumer
// (QueueGroupPrefix and DurablePrefix, which watermill-nats's docs ask
// for with SubscribersCount > 1, else each subscriber gets every
// message), so 4 messages are in flight; AckAsync (the ack is sent
// without awaiting the reply: one lost is a redelivery, absorbed by the
// dedup). TrackMsgId (the server's dedup window) stays off in both: the
// consumer deduplicates.
type natsPubSub struct {
	subscribers int
	ackAsync    bool
}

func (n natsPubSub) newTopic(b *testing.B) string {
	// A stream name may not hold '.', a subject token may: UniqueName
	// gives neither.
	s := testenv.UniqueName("wmbench")
	b.Cleanup(func() {
		nc, err := natsgo.Connect(testenv.NATSURL())
		if err != nil {
			b.Logf("watermill bench: delete stream %s: %v", s, err)
			return
		}
		defer nc.Close()
		js, err := nc.JetStream()
		if err != nil {
			b.Logf("watermill bench: delete stream %s: %v", s, err)
			return
		}
		if err := js.DeleteStream(s); err != nil && !errors.Is(err, natsgo.ErrStreamNotFound) {
			b.Logf("watermill bench: delete stream %s: %v", s, err)
		}
	})
	return s
}

func (n natsPubSub) jetStream() wnats.JetStreamConfig {
	js := wnats.JetStreamConfig{AckAsync: n.ackAsync}
	if n.subscribers > 1 {
		js.DurablePrefix = "wmbench"
	}
	return js
}

func (n natsPubSub) publisher() (message.Publisher, error) {
	return wnats.NewPublisher(wnats.PublisherConfig{URL: testenv.NATSURL(), JetStream: n.jetStream()}, logger)
}

func (n natsPubSub) subscriber(string) (message.Subscriber, error) {
	cfg := wnats.SubscriberConfig{URL: testenv.NATSURL(), SubscribersCount: n.subscribers, JetStream: n.jetStream()}
	if n.subscribers > 1 {
		cfg.QueueGroupPrefix = "wmbench"
	}
	return wnats.NewSubscriber(cfg, logger)
}

func (n natsPubSub) subscriptions() int { return 1 }
func (n natsPubSub) inFlight() int      { return n.subscribers }

func (n natsPubSub) String() string {
	consumer := "ephemeral consumer"
	if n.subscribers > 1 {
		consumer = "durable consumer, queue group"
	}
	return fmt.Sprintf("nats JetStream SubscribersCount=%d (%s) AckAsync=%v TrackMsgId=false", n.subscribers, consumer, n.ackAsync)
}

// sqsPubSub is watermill-aws's sqs package on an SQS server
// (FERRY_SQS_ENDPOINT, ElasticMQ here, through its documented
// OverrideEndpointResolver): the forwarder's publisher sends one
// SendMessage per message; each of the subscriber's ConsumeWorkers
// long-polls ReceiveMessage (WaitTimeSeconds 20), hands out the
// received messages one at a time and deletes each after its ack with
// one DeleteMessage (no DeleteMessageBatch).
//
// defaults: the package's defaults: 1 worker, MaxNumberOfMessages 1 (so
// two calls per message: a receive and a delete). tuned: 4 workers
// receiving up to 10 messages per call (SQS's maximum), the shape of
// ferry's SQS subscription (4 pollers of 10): 4 messages in flight and a
// receive per up to 10 messages. The publisher has nothing to tune: the
// forwarder publishes one message at a time.
type sqsPubSub struct {
	workers     int
	maxMessages int32
}

func (s sqsPubSub) awsConfig() aws.Config {
	return aws.Config{
		Region: testenv.AWSRegion(),
		// ElasticMQ accepts any credentials; AWS would take the
		// environment's.
		Credentials: credentials.NewStaticCredentialsProvider("ferry", "ferry", ""),
	}
}

// endpoint points the SQS client at FERRY_SQS_ENDPOINT.
func (s sqsPubSub) endpoint() []func(*sqs.Options) {
	u, err := url.Parse(testenv.SQSEndpoint())
	if err != nil {
		// testenv's value or the environment's: reported by the first call.
		u = &url.URL{Scheme: "http", Host: testenv.SQSEndpoint()}
	}
	return []func(*sqs.Options){sqs.WithEndpointResolverV2(wsqs.OverrideEndpointResolver{Endpoint: smithyendpoints.Endpoint{URI: *u}})}
}

func (s sqsPubSub) newTopic(b *testing.B) string {
	q := testenv.UniqueName("wmbench")
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := sqs.NewFromConfig(s.awsConfig(), s.endpoint()...)
		u, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(q)})
		if err == nil {
			_, err = c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: u.QueueUrl})
		}
		if err != nil && !strings.Contains(err.Error(), "NonExistentQueue") {
			b.Logf("watermill bench: delete queue %s: %v", q, err)
		}
	})
	return q
}

func (s sqsPubSub) publisher() (message.Publisher, error) {
	return wsqs.NewPublisher(wsqs.PublisherConfig{AWSConfig: s.awsConfig(), OptFns: s.endpoint()}, logger)
}

func (s sqsPubSub) subscriber(string) (message.Subscriber, error) {
	cfg := wsqs.SubscriberConfig{AWSConfig: s.awsConfig(), OptFns: s.endpoint(), ConsumeWorkers: s.workers}
	if s.maxMessages > 1 {
		cfg.GenerateReceiveMessageInput = func(ctx context.Context, u wsqs.QueueURL) (*sqs.ReceiveMessageInput, error) {
			in, err := wsqs.GenerateReceiveMessageInputDefault(ctx, u)
			if err != nil {
				return nil, err
			}
			in.MaxNumberOfMessages = s.maxMessages
			return in, nil
		}
	}
	return wsqs.NewSubscriber(cfg, logger)
}

func (s sqsPubSub) subscriptions() int { return 1 }
func (s sqsPubSub) inFlight() int      { return s.workers }

func (s sqsPubSub) String() string {
	return fmt.Sprintf("sqs ConsumeWorkers=%d MaxNumberOfMessages=%d WaitTimeSeconds=20, a DeleteMessage per ack, a SendMessage per publish", s.workers, s.maxMessages)
}
