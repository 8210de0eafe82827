//! The cleaner: background passes, cleaning ahead by writers, small and full data areas.
//! Guards against NoSpace while live data fits, dead ends a full volume cannot leave, and a
//! moved block coming back older or lost.

mod clean_ahead;
mod passes;
mod reserve;
mod small_area;
mod space;
mod space_short;
