//! What users write to process messages: a type, an `async fn` or a closure.

use std::future::Future;

use bytes::Bytes;
use serde::Serialize;

use crate::{Error, Received, Result};

/// Processes a message whose effect lives outside the dedup record (an HTTP call, an
/// email, a Redis write): used by the [`IdempotentReceiver`](super::IdempotentReceiver).
///
/// Implement it on a type, or make one of a function with [`handler_fn`]:
///
/// ```
/// use oncebox_core::{Received, Result};
/// use oncebox_core::consumer::{Handler, handler_fn};
///
/// let notify = handler_fn(|msg: &Received| {
///     let order_id = msg.key.clone();
///     async move {
///         // send the e-mail for `order_id` ...
///         # let _ = order_id;
///         Ok(())
///     }
/// });
/// # fn is_handler<H: Handler>(_: &H) {}
/// # is_handler(&notify);
/// ```
///
/// The `Ok` value is the result kept for duplicates: anything that is a
/// [`HandlerOutput`], `()` included. Errors are classified by [`Error::fault`]: a
/// permanent one dead-letters the message at once, a transient one is retried with
/// backoff up to the attempt limit, an outage is retried without spending attempts.
pub trait Handler: Send + Sync {
    /// The result kept for duplicates.
    type Output: HandlerOutput;

    /// Handles one message.
    ///
    /// # Errors
    ///
    /// Why the message could not be handled; see the trait docs for what each fault does.
    ///
    /// # Cancel safety
    ///
    /// The future may be dropped (shutdown, the lease could not be kept): the message is
    /// then delivered again.
    fn handle<'a>(
        &'a self,
        message: &'a Received,
    ) -> impl Future<Output = Result<Self::Output>> + Send + 'a;
}

/// A function of a message for each lifetime: what [`handler_fn`] takes to make a
/// [`Handler`]. Implemented for every fitting function; never implement it yourself.
pub trait HandlerFn<'a>: Send + Sync {
    /// The handler's result.
    type Output: HandlerOutput;
    /// The handler's future.
    type Future: Future<Output = Result<Self::Output>> + Send + 'a;

    /// Calls the function.
    fn call(&self, message: &'a Received) -> Self::Future;
}

impl<'a, F, Fut, R> HandlerFn<'a> for F
where
    F: Fn(&'a Received) -> Fut + Send + Sync,
    Fut: Future<Output = Result<R>> + Send + 'a,
    R: HandlerOutput,
{
    type Output = R;
    type Future = Fut;

    fn call(&self, message: &'a Received) -> Fut {
        self(message)
    }
}

/// A function as a handler: see [`handler_fn`].
#[derive(Debug, Clone, Copy)]
pub struct FnHandler<F>(F);

/// Makes a [`Handler`] or a [`TxHandler`] of a function: an `async fn`, an `async`
/// closure that captures nothing, or a closure returning a `Send` future that owns what
/// it uses.
///
/// ```
/// use oncebox_core::{Received, Result};
/// use oncebox_core::consumer::{Handler, TxHandler, handler_fn};
///
/// # struct Tx;
/// async fn charge(msg: &Received, tx: &mut Tx) -> Result<()> {
///     # let _ = (msg, tx);
///     Ok(())
/// }
/// let charge = handler_fn(charge);
///
/// let mailer = handler_fn(|msg: &Received| {
///     let to = msg.key.clone();
///     async move {
///         # let _ = to;
///         Ok("sent")
///     }
/// });
/// # fn is_tx<H: TxHandler<Tx>>(_: &H) {}
/// # fn is<H: Handler>(_: &H) {}
/// # is_tx(&charge);
/// # is(&mailer);
/// ```
pub fn handler_fn<F>(function: F) -> FnHandler<F> {
    FnHandler(function)
}

impl<F, R> Handler for FnHandler<F>
where
    F: for<'a> HandlerFn<'a, Output = R>,
    R: HandlerOutput,
{
    type Output = R;

    fn handle<'a>(&'a self, message: &'a Received) -> impl Future<Output = Result<R>> + Send + 'a {
        self.0.call(message)
    }
}

/// Processes a message inside the store's transaction `Tx`: the handler's writes, the
/// dedup record and the result commit together, so the effect happens exactly once.
/// Used by the [`TransactionalInbox`](super::TransactionalInbox) and the
/// [`DurableInbox`](super::DurableInbox).
///
/// With the SQL stores, `Tx` is a `sqlx::Transaction<'static, DB>`: run queries on
/// `&mut **tx`, and use `?` on their errors: with the SQL stores, `sqlx::Error` converts
/// into [`Error`] by its SQLSTATE (a deadlock or serialization failure is transient, a
/// constraint or data error permanent, a lost connection an outage).
///
/// Implement it on a type, or make one of an `async fn` (or an `async` closure that
/// captures nothing) with [`handler_fn`]:
///
/// ```
/// use oncebox_core::{Received, Result};
/// use oncebox_core::consumer::{TxHandler, handler_fn};
///
/// struct Tx; // stands for sqlx::Transaction<'static, Sqlite>
///
/// async fn charge(msg: &Received, tx: &mut Tx) -> Result<()> {
///     let order: serde_json::Value = msg.payload_json()?; // not JSON: dead-lettered at once
///     # let _ = (order, tx);
///     // sqlx::query("INSERT INTO charges ...").execute(&mut **tx).await?;
///     Ok(())
/// }
/// # fn is_handler<H: TxHandler<Tx>>(_: &H) {}
/// # is_handler(&handler_fn(charge));
/// ```
///
/// Errors are classified as for [`Handler`]; any error rolls the transaction back.
pub trait TxHandler<Tx>: Send + Sync {
    /// The result kept with the dedup record and handed to duplicates.
    type Output: HandlerOutput;

    /// Handles one message inside `tx`. Do not commit or roll back `tx`.
    ///
    /// # Errors
    ///
    /// Why the message could not be handled; the transaction is rolled back.
    ///
    /// # Cancel safety
    ///
    /// The future may be dropped: the transaction rolls back and the message is
    /// delivered again.
    fn handle<'a>(
        &'a self,
        message: &'a Received,
        tx: &'a mut Tx,
    ) -> impl Future<Output = Result<Self::Output>> + Send + 'a;
}

/// A function of a message and a transaction for each lifetime: what [`handler_fn`]
/// takes to make a [`TxHandler`]. Implemented for every fitting function; never implement
/// it yourself.
pub trait TxHandlerFn<'a, Tx: 'a>: Send + Sync {
    /// The handler's result.
    type Output: HandlerOutput;
    /// The handler's future.
    type Future: Future<Output = Result<Self::Output>> + Send + 'a;

    /// Calls the function.
    fn call(&self, message: &'a Received, tx: &'a mut Tx) -> Self::Future;
}

impl<'a, Tx: 'a, F, Fut, R> TxHandlerFn<'a, Tx> for F
where
    F: Fn(&'a Received, &'a mut Tx) -> Fut + Send + Sync,
    Fut: Future<Output = Result<R>> + Send + 'a,
    R: HandlerOutput,
{
    type Output = R;
    type Future = Fut;

    fn call(&self, message: &'a Received, tx: &'a mut Tx) -> Fut {
        self(message, tx)
    }
}

impl<Tx, F, R> TxHandler<Tx> for FnHandler<F>
where
    F: for<'a> TxHandlerFn<'a, Tx, Output = R>,
    R: HandlerOutput,
{
    type Output = R;

    fn handle<'a>(
        &'a self,
        message: &'a Received,
        tx: &'a mut Tx,
    ) -> impl Future<Output = Result<R>> + Send + 'a {
        self.0.call(message, tx)
    }
}

/// What a handler may return on success: the result kept with the dedup record and
/// handed to duplicates, as bytes.
///
/// Implemented for `()` (nothing to keep), [`Bytes`], `Vec<u8>`, `String`, `&'static
/// str`, `&'static [u8]` and [`Json<T>`].
pub trait HandlerOutput: Send {
    /// The bytes to keep.
    ///
    /// # Errors
    ///
    /// A permanent error if the value cannot be encoded.
    fn into_bytes(self) -> Result<Bytes>;
}

impl HandlerOutput for () {
    fn into_bytes(self) -> Result<Bytes> {
        Ok(Bytes::new())
    }
}

macro_rules! output_into_bytes {
    ($($ty:ty),*) => {$(
        impl HandlerOutput for $ty {
            fn into_bytes(self) -> Result<Bytes> {
                Ok(Bytes::from(self))
            }
        }
    )*};
}

output_into_bytes!(Bytes, Vec<u8>, String, &'static str, &'static [u8]);

/// A value kept as JSON: return `Json(receipt)` from a handler to keep the receipt for
/// duplicates. To read a payload as JSON, see
/// [`Received::payload_json`]: with `?` in a handler, a payload that does not decode
/// dead-letters the message as a permanent failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Json<T>(pub T);

impl<T: Serialize + Send> HandlerOutput for Json<T> {
    fn into_bytes(self) -> Result<Bytes> {
        serde_json::to_vec(&self.0)
            .map(Bytes::from)
            .map_err(Error::handler_permanent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_tx_handler<Tx, H: TxHandler<Tx>>(_: &H) {}
    fn is_handler<H: Handler>(_: &H) {}

    struct Conn(u32);

    async fn counts(_: &Received, conn: &mut Conn) -> Result<()> {
        conn.0 += 1;
        Ok(())
    }

    #[test]
    fn functions_and_closures_are_handlers() {
        is_tx_handler(&handler_fn(counts));
        is_tx_handler(&handler_fn(async |msg: &Received, conn: &mut Conn| {
            conn.0 += 1;
            Ok(msg.kind.clone())
        }));
        is_handler(&handler_fn(|msg: &Received| {
            let kind = msg.kind.clone();
            async move { Ok(Json(kind)) }
        }));
        async fn notify(msg: &Received) -> Result<&'static str> {
            Ok(if msg.kind.is_empty() { "" } else { "sent" })
        }
        is_handler(&handler_fn(notify));
        is_tx_handler::<Conn, _>(&Generic(std::marker::PhantomData));
    }

    /// Handlers generic over the transaction (test harnesses, libraries) are types too.
    struct Generic<T>(std::marker::PhantomData<T>);

    impl<Tx: Send + Sync> TxHandler<Tx> for Generic<Tx> {
        type Output = ();

        async fn handle(&self, _: &Received, _: &mut Tx) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn outputs_become_bytes() {
        assert!(().into_bytes().unwrap().is_empty());
        assert_eq!("ok".into_bytes().unwrap(), Bytes::from_static(b"ok"));
        assert_eq!(
            Json(serde_json::json!({"a": 1})).into_bytes().unwrap(),
            Bytes::from_static(br#"{"a":1}"#)
        );
    }
}
